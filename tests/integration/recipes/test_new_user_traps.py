"""The commands the README and docs show, typed into a shell as a new user types them (issue 38, item 7):
each once failed or misled, and each test here fails again if its fix is taken out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent  # the venv's `rlmesh` console script sits beside its python


def typed(line: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 170) -> subprocess.CompletedProcess:
    """``line`` run by bash, as typed (the shell's quoting included), with the venv's ``rlmesh`` on PATH."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RLMESH_", "HYDRA_"))}
    full.update({"PATH": f"{BIN}{os.pathsep}{full.get('PATH', '')}", "PYTHONPATH": str(ROOT),
                 "RLMESH_RUNS_DIR": str(cwd / "runs"), **(env or {})})
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(180)
def test_cfg_hydra_resolve_prints_the_hydra_node(tmp_path):
    out = typed("rlmesh run recipe=ppo_cartpole -c hydra --resolve", tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"dir: {tmp_path / 'runs'}/hydra/" in out.stdout, out.stdout[:2000]


@pytest.mark.timeout(180)
def test_export_to_both_as_documented(tmp_path):
    """docs/dashboard.md: ``telemetry.export='tensorboard,wandb'`` (the shell removes the quotes)."""
    out = typed("rlmesh run recipe=ppo_cartpole telemetry.export='tensorboard,wandb' --cfg job", tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "export: tensorboard,wandb" in out.stdout
    out = typed("rlmesh run recipe=ppo_cartpole trainer.lr=1e-3,2e-3 --cfg job", tmp_path)   # a number: a sweep
    assert out.returncode == 2 and "--multirun" in out.stderr, out.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bad, says", [
    ("recipe=ppo_cartpole trainer.lrr=1", "config error: trainer.lrr is not a config key: did you mean trainer.lr?"),
    ("recipe=ppo_cartpol", "config error: recipe=ppo_cartpol is not a preset: use one of"),
    ("recipe=ppo_cartpole trainer.lr=-1", "config error: trainer.lr=-1.0 is invalid"),
])
def test_an_error_keeps_its_form_with_hydra_flags(tmp_path, bad, says):
    """The same line and exit status 2 with or without Hydra's flags (they once gave Hydra's multi-line
    report, or a printed config, and exit status 1 or 0)."""
    for flags in ("", "--cfg job", "-c hydra --resolve", "-m"):
        out = typed(f"rlmesh run {bad} {flags}", tmp_path)
        err = out.stderr.strip()
        assert out.returncode == 2, (flags, out.returncode, err[-2000:])
        assert any(ln.startswith(says) for ln in err.splitlines()), (flags, err[-2000:])
        assert "Traceback" not in err and "HYDRA_FULL_ERROR" not in err, (flags, err[-2000:])
    assert not list(tmp_path.glob("runs/*/telemetry.duckdb"))


@pytest.mark.timeout(180)
def test_logs_says_when_there_is_nothing(tmp_path):
    made = typed(f"{sys.executable} -c 'import rlmesh as rm; rm.telemetry.record(\"x\", a=1.0)'", tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    out = typed("rlmesh logs", tmp_path)
    assert out.returncode == 0 and out.stdout == "", out
    assert out.stderr.startswith("rlmesh logs: no log lines in run ") and len(out.stderr.splitlines()) == 1, out.stderr
    out = typed("rlmesh logs --level ERROR", tmp_path)
    assert out.stderr.strip().endswith("matching --level ERROR"), out.stderr


@pytest.mark.timeout(240)
def test_replacing_a_presets_trainer_says_what_it_resets(tmp_path):
    """docs/extending.md: a recipe of one's own that swaps ppo_cartpole's trainer for a new class gets that
    class's defaults, not the preset's tuned values and budget; rlmesh names them in one line."""
    conf = tmp_path / "conf" / "recipe"
    conf.mkdir(parents=True)
    (conf / "my_ppo.yaml").write_text("# @package _global_\ndefaults:\n  - ppo_cartpole\n"
                                      "  - override /trainer: mc_ppo\n  - _self_\n\ntrainer:\n  mc_lambda: 0.9\n")
    env = {"PYTHONPATH": f"{ROOT / 'examples' / 'algorithms'}{os.pathsep}{ROOT}", "RLMESH_ALGORITHMS": "mc_ppo"}
    out = typed(f"rlmesh run recipe=my_ppo hydra.searchpath=[file://{tmp_path}/conf] trainer.lr=0.002 --cfg job",
                tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    (note,) = [ln for ln in out.stderr.splitlines() if "resets" in ln]
    assert note.startswith("rlmesh: trainer=mc_ppo replaces recipe ppo_cartpole's trainer=ppo_cartpole and resets")
    assert "total_steps 100000 -> 1000000" in note and "gamma 0.98 -> 0.99" in note, note
    assert "lr " not in note.replace("_lr", ""), note                 # set on the command line: kept, not reset
    # The shipped example sets the preset's values again: a fair comparison, and no note.
    out = typed("rlmesh run recipe=mc_ppo_cartpole hydra.searchpath=[file://$PWD/examples/algorithms/conf] "
                "trainer.mc_lambda=0.95 --cfg job", ROOT, env={**env, "RLMESH_RUNS_DIR": str(tmp_path / "runs")})
    assert out.returncode == 0 and "resets" not in out.stderr, out.stderr[-2000:]
    # On the command line too (docs/extending.md: `rlmesh run recipe=grpo_addition trainer=rloo ...`).
    out = typed("rlmesh run recipe=grpo_addition trainer=rloo trainer.scale_by_std=true --cfg job", tmp_path)
    assert "trainer=rloo replaces recipe grpo_addition's trainer=grpo_addition" in out.stderr, out.stderr[-2000:]
    assert "lr 0.0005 -> 0.0001" in out.stderr and "sft_steps 500 -> 0" in out.stderr


@pytest.mark.timeout(240)
def test_a_sweep_summary_piped_to_a_file_keeps_every_override_whole(tmp_path):
    lrs = ("-0.0012345678901234", "-0.0022345678901234")   # invalid: the jobs end at validation, no run
    out = typed(f"rlmesh run -m recipe=ppo_cartpole generator.replicas=1 trainer.total_steps=4096 "
                f"'trainer.lr={','.join(lrs)}' > summary.txt", tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    text = (tmp_path / "summary.txt").read_text()
    rows = [ln for ln in text.splitlines() if "config error" in ln]
    assert len(rows) == 2 and all(f"trainer.lr={lr}" in row for lr, row in zip(lrs, rows)), text
    assert "every job: recipe=ppo_cartpole generator.replicas=1 trainer.total_steps=4096" in text, text


@pytest.mark.timeout(600)
def test_the_documented_fault_example_shows_a_kill_and_a_recovery(tmp_path):
    """README / docs/faults.md: ppo_cartpole solves CartPole in ~10-15 s; the preset's first kill once came at
    15 s, so the headline example injected nothing."""
    out = typed("rlmesh run recipe=ppo_cartpole faults=generator_kill", tmp_path, timeout=580)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fault injection: kill" in out.stderr, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if "proc failures" in ln]
    died, restarted = (int(n) for n in re.search(r"(\d+) died, (\d+) restarted", line).groups())
    assert died >= 1 and restarted == died, line
    assert re.search(r"re-issued, 0 dropped, 0 lost", out.stdout), out.stdout[-3000:]


@pytest.mark.timeout(300)
def test_start_up_says_what_it_does_at_once(tmp_path):
    """A recipe once printed nothing for its first 55-70 s on a busy host (imports, procs, actors)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMESH_", "HYDRA_"))}
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(ROOT),
                "RLMESH_RUNS_DIR": str(tmp_path / "runs")})
    began = time.monotonic()
    p = subprocess.Popen(["bash", "-c", "exec rlmesh run recipe=ppo_cartpole"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = p.stdout.readline()
        first_s = time.monotonic() - began
        lines = [first]
        while "[train]" not in lines[-1] and lines[-1]:
            lines.append(p.stdout.readline())
    finally:
        p.terminate()  # SIGTERM: a clean stop, as Ctrl-C
        p.communicate(timeout=120)
    assert first.startswith("[start] loading rlmesh"), lines
    assert first_s < 5, f"the first line came {first_s:.1f} s after the command"
    phases = [ln.split("  ", 1)[1].strip() for ln in lines[1:] if ln.startswith("[start]")]
    assert [ph.split(" ")[0] for ph in phases] == ["composing", "running", "run", "creating", "actors"], lines
    assert "procs (local)" in phases[2] and phases[-1] == "actors ready; training", phases
