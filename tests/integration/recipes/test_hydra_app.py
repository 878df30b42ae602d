"""``rlmesh run`` with Hydra's own flags is Hydra's application: help lists the config groups and their
options, --info and --cfg hydra work, and shell completion completes config keys of ``rlmesh run``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def rlmesh(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    full.update(PYTHONPATH=str(ROOT), RLMESH_RUNS_DIR=str(cwd / "runs"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "rlmesh.cli", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=170)


@pytest.mark.timeout(180)
def test_help_lists_groups_and_options(tmp_path):
    out = rlmesh("run", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "== Configuration groups ==" in out.stdout
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("trainer: "))
    assert {"grpo", "grpo_addition", "ppo", "ppo_cartpole", "a2c", "dqn", "rloo", "dapo"} <= set(
        line.removeprefix("trainer: ").split(", ")), line
    recipes = next(ln for ln in out.stdout.splitlines() if ln.startswith("recipe: "))
    assert {"grpo_addition", "ppo_cartpole", "ppo_pendulum", "a2c_cartpole", "dqn_cartpole", "rloo_addition",
            "dapo_addition", "drgrpo_addition"} <= set(recipes.removeprefix("recipe: ").split(", ")), recipes
    assert "rlmesh run resume=latest" in out.stdout


@pytest.mark.timeout(180)
def test_info_and_cfg_hydra(tmp_path):
    out = rlmesh("run", "--info", "searchpath", cwd=tmp_path)
    assert out.returncode == 0 and "Config search path" in out.stdout, out.stderr
    out = rlmesh("run", "recipe=grpo_addition", "-c", "hydra", cwd=tmp_path)
    assert out.returncode == 0 and "name: rlmesh_run" in out.stdout and "recipe: grpo_addition" in out.stdout, out.stderr
    out = rlmesh("run", "recipe=grpo_addition", "trainer.lr=0.01", "--cfg", "job", cwd=tmp_path)
    assert out.returncode == 0 and "lr: 0.01" in out.stdout and "_target_: rlmesh.rl.algorithms.grpo.GRPOTrainer" in out.stdout
    assert not (tmp_path / "runs").exists()                     # printing a config runs nothing


@pytest.mark.timeout(180)
def test_shell_completion(tmp_path):
    out = rlmesh("run", "--shell-completion", "install=bash", cwd=tmp_path)
    assert out.returncode == 0 and "complete -o nospace -o default -F hydra_bash_completion rlmesh" in out.stdout
    line = "rlmesh run trainer.l"
    out = rlmesh("-sc", "query=bash", cwd=tmp_path, env={"COMP_LINE": line, "COMP_POINT": str(len(line))})
    assert out.returncode == 0 and "trainer.lr=" in out.stdout.split(), out.stdout + out.stderr
