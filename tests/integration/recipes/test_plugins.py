"""A package outside the repository adds an algorithm without editing rlmesh: an ``rlmesh.algorithms``
entry point stores its config in the ConfigStore, its YAML recipes come from ``hydra.searchpath=[pkg://...]``,
and ``rlmesh run`` spawns its trainer class and takes its config fields on the command line.

The package is made importable the way an installed one is: its folder and a ``*.dist-info`` with an
``entry_points.txt`` on ``sys.path`` (what ``pip install`` writes, minus the copying)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]

PLUGIN = '''
"""A user's algorithm: PPO with Monte-Carlo returns (lambda = 1), one file."""
from dataclasses import dataclass

from rlmesh.rl.actors import PPOTrainer
from rlmesh.rl.config import PPOConfig


@dataclass
class MCPPOConfig(PPOConfig):
    _target_: str = "my_algos.mc_ppo.MCPPOTrainer"
    mc_lambda: float = 1.0
    """GAE lambda used in place of trainer.gae_lambda."""


class MCPPOTrainer(PPOTrainer):
    config: MCPPOConfig

    def compute_advantages(self, rollout):
        from rlmesh.rl.ppo_core import rollout_advantages
        return rollout_advantages(rollout, self.config.gamma, gae_lambda=self.config.mc_lambda)

    def train_step(self, batch):
        return {**super().train_step(batch), "train/mc_lambda": self.config.mc_lambda}  # proves this class trained


def register(cs):
    cs.store(group="trainer", name="mc_ppo", node=MCPPOConfig)
'''

RECIPE = """\
# @package _global_
defaults:
  - ppo_cartpole
  - override /trainer: mc_ppo
  - _self_
generator: {num_envs: 4, num_steps: 16}
trainer: {total_steps: 384, num_minibatches: 2, mc_lambda: 0.9}
eval: {every: 0, episodes: 2, target: null}
run: {progress: false}
"""


def make_site(tmp_path: Path, broken: bool = False) -> Path:
    site = tmp_path / "site"
    pkg = site / "my_algos"
    (pkg / "conf" / "recipe").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "conf" / "__init__.py").write_text("")
    (pkg / "mc_ppo.py").write_text(PLUGIN if not broken else "raise ImportError('no torch here')\n")
    (pkg / "conf" / "recipe" / "mc_cartpole.yaml").write_text(RECIPE)
    dist = site / "my_algos-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-algos\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlmesh.algorithms]\nmc_ppo = my_algos.mc_ppo:register\n")
    return site


def rlmesh_run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")])
    env["RLMESH_RUNS_DIR"] = str(cwd / "runs")
    return subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=170)


@pytest.mark.timeout(120)
def test_plugin_config_fields_are_command_line_settings(tmp_path):
    site = make_site(tmp_path)
    out = rlmesh_run(site, tmp_path, "recipe=ppo_cartpole", "trainer=mc_ppo", "trainer.mc_lambda=0.5", "--cfg", "job")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "_target_: my_algos.mc_ppo.MCPPOTrainer" in out.stdout and "mc_lambda: 0.5" in out.stdout
    out = rlmesh_run(site, tmp_path, "recipe=ppo_cartpole", "trainer=mc_ppo", "trainer.mc_lamda=0.5")
    assert out.returncode == 2
    assert "config error: trainer.mc_lamda is not a config key: did you mean trainer.mc_lambda?" in out.stderr


@pytest.mark.timeout(120)
def test_a_broken_plugin_is_one_line_naming_it(tmp_path):
    site = make_site(tmp_path, broken=True)
    out = rlmesh_run(site, tmp_path, "recipe=ppo_cartpole", "--cfg", "job")
    assert out.returncode == 2
    assert "rlmesh.algorithms entry point mc_ppo = my_algos.mc_ppo:register (from my-algos) failed" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.timeout(180)
def test_plugin_recipe_from_a_package_search_path_trains(tmp_path):
    site = make_site(tmp_path)
    out = rlmesh_run(site, tmp_path, "recipe=mc_cartpole", "hydra.searchpath=[pkg://my_algos.conf]",
                     "telemetry.health_interval_s=0")
    assert out.returncode == 0, out.stderr[-3000:]
    (db,) = (tmp_path / "runs").glob("2*/telemetry.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
        metrics = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM train_steps").fetchall()]
    assert config["trainer"]["_target_"] == "my_algos.mc_ppo.MCPPOTrainer" and config["trainer"]["mc_lambda"] == 0.9
    assert len(metrics) >= 6 and all(m["train/mc_lambda"] == 0.9 for m in metrics)
