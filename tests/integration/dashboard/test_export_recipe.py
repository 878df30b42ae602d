"""`rlmesh run recipe=ppo_cartpole telemetry.export=tensorboard`, as a user runs it: the event files
that a stock `tensorboard --logdir runs` reads hold the run's evaluations and losses, step for step."""

import subprocess
import sys

import duckdb
import pytest

from dash_helpers import clean_env

pytest.importorskip("tensorboard")

PPO_TINY = ["recipe=ppo_cartpole", "generator.replicas=2", "generator.num_envs=2", "generator.num_steps=16",
            "trainer.total_steps=320", "trainer.num_minibatches=2", "trainer.update_epochs=1", "buffer=on_policy",
            "eval.every=128", "eval.episodes=3", "eval.target=null", "telemetry.health_interval_s=0",
            "telemetry.export=tensorboard"]


@pytest.mark.timeout(300)
def test_recipe_exports_its_curves_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *PPO_TINY], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "curves exported (tensorboard)" in out.stdout
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and not p.is_symlink()]
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"eval/mean_return", "charts/episodic_return", "charts/SPS", "losses/loss", "losses/policy_loss",
            "losses/value_loss", "losses/entropy", "losses/approx_kl", "charts/learning_rate"} <= tags
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        evals = con.execute("SELECT env_steps, value FROM evals ORDER BY rowid").fetchall()
        losses = con.execute("SELECT CAST(sum(samples) OVER (ORDER BY rowid) AS BIGINT), loss FROM train_steps "
                             "ORDER BY rowid").fetchall()
    assert [(e.step, e.value) for e in acc.Scalars("eval/mean_return")] == [(s, pytest.approx(v)) for s, v in evals]
    assert [(e.step, e.value) for e in acc.Scalars("losses/loss")] == [(s, pytest.approx(v)) for s, v in losses]
