"""``rlmesh run recipe=grpo_calculator`` end to end at a tiny size: env mesh, multi-turn generators,
the unchanged GRPO trainer, and the telemetry that says what happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]


def run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def q(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db / "telemetry.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()

TINY = ["recipe=grpo_calculator", "buffer=on_policy", "steps=3", "prompts_per_step=4", "generator.samples_per_prompt=4",
        "trainer.sft_steps=0", "eval.every=3", "eval.episodes=8", "model.d_model=32", "model.n_layers=1",
        "model.n_heads=2", "telemetry.health_interval_s=0"]


@pytest.mark.timeout(480)  # a gross bound: proc start-up alone took 2 min at load 50 on 2 cores
def test_calculator_recipe_end_to_end(tmp_path):
    out = run([sys.executable, "-m", "rlmesh.cli", "run", *TINY], tmp_path, timeout=450)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out accuracy by version" in out.stdout
    (db,) = sorted({p.parent.resolve() for p in (tmp_path / "runs").glob("2*/telemetry.duckdb")})
    steps = q(db, "SELECT step, policy_version, samples FROM train_steps ORDER BY step")
    assert [s for s, _, _ in steps] == [1, 2, 3]
    ids = q(db, "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts")[0]
    assert ids[0] == ids[1] and ids[0] >= 3 * 16                     # every episode once
    # every trained episode has its turns, the last one saying how it ended (tool calls: test_agentic.py)
    per_ep = q(db, "SELECT r.rollout_id, count(t.turn), count(t.ended) FROM rollouts r LEFT JOIN turns t "
                   "USING (rollout_id) GROUP BY 1")
    assert all(n >= 1 and ended == 1 for _, n, ended in per_ep)
    evals = q(db, "SELECT policy_version, metric, episodes FROM evals ORDER BY policy_version")
    assert [(v, m, e) for v, m, e in evals] == [(0, "mean_reward", 8), (3, "mean_reward", 8)]
