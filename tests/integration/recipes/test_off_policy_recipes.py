"""SAC learns as a user runs it (``rlmesh run recipe=sac_pendulum`` in a subprocess: real procs, real
gymnasium vector envs, torch, DuckDB), on a task small enough for a test: :mod:`reach_env` (steer a point
to a target; an untrained or random actor scores about -12, a good one about -2), which SAC learns in
about a thousand gradient steps where Pendulum needs four thousand. Pendulum itself, full size, against
SB3: benchmarks/algorithms.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY = ["trainer.hidden_sizes=[32,32]", "trainer.batch_size=64", "eval.episodes=20", "eval.target=null",
        "run.progress=false", "telemetry.health_interval_s=0"]
REACH = ["generator.env_id=reach_env:RlmeshReach-v0", "generator.num_steps=20", "trainer.gamma=0.9",
         "trainer.learning_starts=200"]
"""The recipe on :mod:`reach_env` (importable by the run's procs: :func:`run_recipe` puts its folder on
``PYTHONPATH``): one 20-step episode per rollout, a short horizon, 200 random steps first."""


def run_recipe(args: list[str], cwd: Path) -> Path:
    """``rlmesh run`` from ``cwd``; returns the run directory (the one holding ``telemetry.duckdb``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(Path(__file__).parent)])  # rlmesh, and reach_env
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
def test_sac_learns_to_steer_from_two_asynchronous_generators_at_a_bounded_update_to_data_ratio(tmp_path):
    run = run_recipe(["recipe=sac_pendulum", *REACH, "generator.replicas=2", "trainer.total_steps=1600",
                      "eval.every=0"], tmp_path)
    (final,) = [v for (v,) in q(run, "SELECT value FROM evals ORDER BY env_steps DESC LIMIT 1")]
    assert final > -4                            # trained: -1.5 to -1.7; untrained (learning_starts=1600): -9.7
    steps = q(run, "SELECT samples, metrics FROM train_steps ORDER BY step")
    collected = 0
    for samples, m in steps:                     # never more gradient steps than env steps past learning_starts
        collected += samples
        assert json.loads(m)["train/gradient_steps_total"] <= max(0, collected - 200)
    assert json.loads(steps[-1][1])["train/gradient_steps_total"] >= 0.9 * (collected - 200)   # and it kept up
    per_generator = q(run, "SELECT proc, count(*) FROM rollouts GROUP BY proc")
    assert len(per_generator) == 2 and min(n for _, n in per_generator) >= 10
