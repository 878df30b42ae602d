"""SAC and TD3 learn as a user runs them (``rlmesh run recipe=sac_pendulum`` in a subprocess: real procs,
gymnasium's Pendulum-v1, torch, DuckDB), at a size small enough for a test and a threshold well above what
an untrained actor scores (a greedy return of about -1100 to -1500). Full-size figures: benchmarks/algorithms.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY = ["trainer.hidden_sizes=[64,64]", "trainer.batch_size=128", "eval.episodes=10", "eval.target=null",
        "run.progress=false", "telemetry.health_interval_s=0"]


def run_recipe(args: list[str], cwd: Path) -> Path:
    """``rlmesh run`` from ``cwd``; returns the run directory (the one holding ``telemetry.duckdb``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    env.setdefault("RLMESH_START_TIMEOUT_S", "400")  # a busy machine slows proc start-up; it must not fail the test
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *args, *TINY], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=560)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = sorted({p.parent.resolve() for p in (cwd / "runs").glob("2*/telemetry.duckdb")})
    return run


def q(run: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(run / "telemetry.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sac_learns_pendulum_from_two_asynchronous_generators_at_a_bounded_update_to_data_ratio(tmp_path):
    run = run_recipe(["recipe=sac_pendulum", "generator.replicas=2", "generator.num_steps=32",
                      "trainer.total_steps=4000", "eval.every=0"], tmp_path)
    (final,) = [v for (v,) in q(run, "SELECT value FROM evals ORDER BY env_steps DESC LIMIT 1")]
    assert final > -700
    steps = q(run, "SELECT samples, metrics FROM train_steps ORDER BY step")
    collected = 0
    for samples, m in steps:                     # never more gradient steps than env steps past learning_starts
        collected += samples
        assert json.loads(m)["train/gradient_steps_total"] <= max(0, collected - 100)
    assert json.loads(steps[-1][1])["train/gradient_steps_total"] >= 0.9 * (collected - 100)   # and it kept up
    per_generator = q(run, "SELECT proc, count(*) FROM rollouts GROUP BY proc")
    assert len(per_generator) == 2 and min(n for _, n in per_generator) >= 10
