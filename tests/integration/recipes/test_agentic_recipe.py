"""``rlmesh run recipe=grpo_calculator`` end to end at a tiny size: env mesh, multi-turn generators,
the unchanged GRPO trainer, and the telemetry that says what happened."""

from __future__ import annotations

import sys

import pytest

from test_recipes import ROOT, q, run, runs_in

TINY = ["recipe=grpo_calculator", "buffer=on_policy", "steps=3", "prompts_per_step=4", "generator.samples_per_prompt=4",
        "trainer.sft_steps=30", "eval.every=3", "eval.episodes=8", "model.d_model=32", "model.n_layers=1",
        "model.n_heads=2", "telemetry.health_interval_s=0", "task.sft_tool_fraction=1.0"]


@pytest.mark.timeout(240)
def test_calculator_recipe_end_to_end(tmp_path):
    out = run([sys.executable, "-m", "rlmesh.cli", "run", *TINY], tmp_path, timeout=220)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out accuracy by version" in out.stdout
    (db,) = runs_in(tmp_path)
    steps = q(db, "SELECT step, policy_version, samples FROM train_steps ORDER BY step")
    assert [s for s, _, _ in steps] == [1, 2, 3]
    ids = q(db, "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts")[0]
    assert ids[0] == ids[1] and ids[0] >= 3 * 16                     # every episode once
    # every trained episode has its turns, the last one saying how it ended; tools were called
    per_ep = q(db, "SELECT r.rollout_id, count(t.turn), count(t.ended) FROM rollouts r LEFT JOIN turns t "
                   "USING (rollout_id) GROUP BY 1")
    assert all(n >= 1 and ended == 1 for _, n, ended in per_ep)
    assert q(db, "SELECT count(*) FROM turns WHERE tool = 'calculator'")[0][0] > 0
    evals = q(db, "SELECT policy_version, metric, episodes FROM evals ORDER BY policy_version")
    assert [(v, m, e) for v, m, e in evals] == [(0, "mean_reward", 8), (3, "mean_reward", 8)]
    assert (ROOT / "recipes" / "agentic.py").exists()
