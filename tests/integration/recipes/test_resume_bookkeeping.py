"""Issue 11 items 12 and 15, as a user meets them: SIGTERM stops a run cleanly (final checkpoint,
status ``interrupted`` with its cause, no phantom run), a copied run resumes the copy and never
touches the original, ``run.json`` keeps the first start, and a finished run is not resumed
without a larger budget."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
RLMESH = [sys.executable, "-m", "rlmesh.cli", "run"]
PPO = ["recipe=ppo_cartpole", "generator.replicas=1", "generator.num_envs=4", "generator.num_steps=32",
       "trainer.total_steps=12000", "trainer.update_epochs=2", "trainer.num_minibatches=2", "eval.every=0",
       "eval.episodes=2", "eval.target=null", "telemetry.health_interval_s=0", "run.progress=false"]


def env_for(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def q(run_dir: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.timeout(600)
def test_sigterm_then_resume_of_a_copy_then_refusal_when_finished(tmp_path):
    proc = subprocess.Popen(RLMESH + PPO, cwd=tmp_path, env=env_for(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        ckpts = sorted(tmp_path.glob("runs/2*/checkpoints/step_*.json"))
        if ckpts and int(ckpts[-1].stem.split("_")[1]) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGTERM)                             # kill, timeout, a pod deleted: not Ctrl-C
    err = proc.communicate(timeout=180)[1]
    assert proc.returncode == 130, err[-3000:]
    assert "TimeoutError" not in err and "Traceback" not in err, err[-3000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]   # no phantom run
    assert (tmp_path / "runs" / "latest").resolve() == run_dir.resolve()
    assert q(run_dir, "SELECT status, error FROM runs") == [("interrupted", "stopped by SIGTERM")]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and info["error"] == "stopped by SIGTERM"
    assert not (run_dir / "service.json").exists()
    last_step = q(run_dir, "SELECT max(step) FROM train_steps")[0][0]
    assert q(run_dir, "SELECT max(step) FROM checkpoints WHERE event = 'save'")[0][0] == last_step   # final checkpoint

    # a copy, resumed from the same working directory with RLMESH_RUNS_DIR pointing at the copy
    elsewhere = tmp_path / "elsewhere" / "runs"
    elsewhere.mkdir(parents=True)
    copy = elsewhere / run_dir.name
    shutil.copytree(run_dir, copy)
    original = digest(run_dir)
    out = subprocess.run(RLMESH + ["resume=latest"], cwd=tmp_path, env=env_for(RLMESH_RUNS_DIR=str(elsewhere)),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert digest(run_dir) == original                          # the original: not one byte changed
    assert q(copy, "SELECT status FROM runs") == [("ok",)]
    assert q(copy, "SELECT count(*) FROM checkpoints WHERE event = 'load'")[0][0] == 1
    assert q(copy, "SELECT max(step) FROM train_steps")[0][0] > last_step
    resumed = json.loads((copy / "run.json").read_text())
    assert resumed["start_ts"] == info["start_ts"] and resumed["generation_start_ts"] > info["start_ts"]
    assert resumed["rows"] > info["rows"]                        # rows of both controller generations

    # the copy finished: resuming it again would silently train past its budget
    again = subprocess.run(RLMESH + ["resume=latest"], cwd=tmp_path, env=env_for(RLMESH_RUNS_DIR=str(elsewhere)),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already finished" in again.stderr, again.stderr[-3000:]
