"""The new-algorithm example runs end to end through Hydra: trainer=rloo_example picks RLOO's class and config."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(180)
def test_rloo_example_trains_through_the_grpo_recipe(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    args = ["steps=3", "prompts_per_step=8", "generator.samples_per_prompt=4", "trainer.sft_steps=5",
            "trainer.max_groups=null", "eval.every=3", "eval.episodes=8", "model.d_model=32", "model.n_layers=1",
            "model.n_heads=2", "telemetry.health_interval_s=0", "trainer.scale_by_std=true"]
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "rloo_addition.py"), *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    (db,) = {p.resolve() for p in (tmp_path / "runs").glob("2*/telemetry.duckdb")}
    with duckdb.connect(str(db), read_only=True) as con:
        steps = con.execute("SELECT step, metrics FROM train_steps ORDER BY step").fetchall()
        config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
        spawned = {r[0] for r in con.execute("SELECT DISTINCT mesh FROM spans").fetchall()}
    assert [s for s, _ in steps] == [1, 2, 3]
    # RLOO's own config, its field set on the command line, its class chosen by trainer=rloo_example
    assert config["trainer"]["scale_by_std"] is True and config["trainer"]["min_std"] == 1e-6
    assert config["trainer"]["_target_"] == "__main__.RLOOTrainer" and config["trainer"]["lr"] == 5e-4
    assert {"trainer", "generator", "reward", "buffer", "evaluator"} <= spawned
    assert all("losses/loss" in json.loads(m) or "train/informative_fraction" in json.loads(m) for _, m in steps)


def test_rloo_advantages_differ_from_grpo(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import torch
    from rloo_addition import RLOOConfig

    from rlmesh.rl.algorithms.grpo import grpo_advantages
    from rlmesh.rl.losses import rloo_advantages

    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(rloo_advantages(r, 4), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    assert not torch.allclose(rloo_advantages(r, 4), grpo_advantages(r, 4))
    with pytest.raises(ValueError, match=r"trainer\.min_std"):
        RLOOConfig(min_std=0)
