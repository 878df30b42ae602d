"""Both recipes end to end at tiny sizes, as a user runs them (``rlmesh run`` in a subprocess, real
procs, real envs, real DuckDB), then the run's telemetry is checked against what the recipe did."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
RLMESH = [sys.executable, "-m", "rlmesh.cli", "run"]

PPO_TINY = ["recipe=ppo_cartpole", "generator.replicas=2", "generator.num_envs=2", "generator.num_steps=16",
            "trainer.total_steps=320", "trainer.num_minibatches=2", "trainer.update_epochs=1", "buffer=on_policy",
            "eval.every=128", "eval.episodes=3", "eval.target=null", "telemetry.health_interval_s=0"]
GRPO_TINY = ["recipe=grpo_addition", "buffer=on_policy", "steps=4", "prompts_per_step=8", "generator.samples_per_prompt=4",
             "trainer.sft_steps=5", "trainer.max_groups=null", "eval.every=2", "eval.episodes=10",
             "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "telemetry.health_interval_s=0"]


def run(args: list[str], cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def runs_in(cwd: Path) -> list[Path]:
    return sorted({p.parent.resolve() for p in (cwd / "runs").glob("2*/telemetry.duckdb")})


def q(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db / "telemetry.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.timeout(180)
def test_ppo_recipe_end_to_end(tmp_path):
    out = run(RLMESH + PPO_TINY, tmp_path)              # from a directory that is not the checkout
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Query this run:" in out.stdout and "rlmesh sql" in out.stdout
    (db,) = runs_in(tmp_path)
    steps = q(db, "SELECT step, policy_version, samples FROM train_steps ORDER BY step")
    n = len(steps)
    assert n >= 5 and [s for s, _, _ in steps] == list(range(1, n + 1))
    assert [v for _, v, _ in steps] == list(range(1, n + 1))           # versions monotonic, one per step
    ids = q(db, "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts")[0]
    assert ids[0] == ids[1]                                             # no rollout counted twice
    # on-policy with 2 generators: version v produced exactly the 2 rollouts that train step v+1 consumed
    per_version = dict(q(db, "SELECT policy_version, count(*) FROM rollouts GROUP BY 1"))
    samples = dict(q(db, "SELECT policy_version, sum(samples) FROM rollouts GROUP BY 1"))
    for step, _, trained in steps:
        assert per_version[step - 1] == 2 and samples[step - 1] == trained
    assert max(per_version) <= n and sum(per_version.values()) <= 2 * n + 2
    evals = q(db, "SELECT metric, episodes, policy_version, env_steps FROM evals ORDER BY policy_version")
    assert evals and all(m == "mean_return" and e == 3 for m, e, _, _ in evals)
    assert [v for _, _, v, _ in evals] == sorted(v for _, _, v, _ in evals)
    syncs = q(db, "SELECT count(*), bool_and(ok), count(DISTINCT version) FROM weight_syncs")[0]
    assert syncs[0] >= n and syncs[1] and syncs[2] >= n
    config = json.loads(q(db, "SELECT config FROM runs")[0][0])
    assert config["generator"]["replicas"] == 2 and config["trainer"]["total_steps"] == 320


@pytest.mark.timeout(420)
def test_grpo_recipe_end_to_end(tmp_path):
    # the bound is a hang guard: at load 40-50 this small run took over 150 s
    out = run([sys.executable, str(ROOT / "recipes" / "grpo.py"), *GRPO_TINY[1:]], tmp_path, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    (db,) = runs_in(tmp_path)
    steps = q(db, "SELECT step, policy_version, samples FROM train_steps ORDER BY step")
    assert [s for s, _, _ in steps] == [1, 2, 3, 4] and [v for _, v, _ in steps] == [1, 2, 3, 4]
    ids = q(db, "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts")[0]
    assert ids[0] == ids[1]
    per_version = dict(q(db, "SELECT policy_version, count(*) FROM rollouts GROUP BY 1"))
    for step, _, trained in steps:                          # 8 prompts x 4 samples per version, all trained on
        assert per_version[step - 1] == 32 == trained
    # every training completion was scored once by a reward actor, with the same reward the rollout row has
    mismatch = q(db, "SELECT count(*) FROM rollouts r LEFT JOIN rewards w USING (rollout_id) "
                     "WHERE w.reward IS NULL OR w.reward <> r.reward")[0][0]
    assert mismatch == 0
    evals = q(db, "SELECT policy_version, metric, episodes FROM evals ORDER BY policy_version")
    assert [(v, m, e) for v, m, e in evals] == [(0, "mean_reward", 10), (2, "mean_reward", 10), (4, "mean_reward", 10)]
    # warm-up phases: the SFT warm start and each generator's engine start, in `phases` and on the (piped) output
    phases = dict(q(db, "SELECT mesh || ': ' || phase, max(completed) FILTER (WHERE state = 'done') FROM phases GROUP BY 1"))
    assert phases["trainer: SFT warm start"] == 5 and "generator: engine start" in phases
    assert "[trainer: SFT warm start] 5/5 steps  done" in out.stdout


EVAL_TINY = [a for a in PPO_TINY if not a.startswith(("generator.replicas", "eval.every", "eval.target", "buffer="))]


@pytest.mark.timeout(300)
def test_one_evaluation_per_version_and_a_summary_that_agrees_with_evals(tmp_path):
    """Issue 11 item 16: the final evaluation ran twice (the last train step crossed an eval.every
    boundary, and the "final weights" check ran before the periodic evaluation had started), and with
    3 generators the summary's "final eval" was the last row to *arrive*, not the newest version's."""
    out = run(RLMESH + EVAL_TINY + ["generator.replicas=3", "generator.num_steps=8", "trainer.total_steps=480",
                               "eval.every=48", "eval.target=-1", "buffer=one_ahead"], tmp_path, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    (db,) = runs_in(tmp_path)
    per_version = q(db, "SELECT policy_version, count(*) FROM evals GROUP BY 1 ORDER BY 1")
    assert per_version and all(n == 1 for _, n in per_version), per_version
    newest = q(db, "SELECT value, policy_version FROM evals ORDER BY policy_version DESC LIMIT 1")[0]
    first = q(db, "SELECT policy_version FROM evals WHERE value >= -1 ORDER BY policy_version LIMIT 1")[0][0]
    summary = " ".join(out.stdout.split())
    assert f"final eval │ mean_return {newest[0]:.3g} (version {newest[1]})" in summary, out.stdout
    assert f"solved │ version {first} (" in summary, out.stdout


@pytest.mark.timeout(300)
def test_the_final_evaluation_runs_once_when_the_budget_ends_on_an_eval_boundary(tmp_path):
    """320 env steps, an evaluation every 64: the last train step is both a periodic evaluation and the
    final one (before the fix: two ``evals`` rows for its version)."""
    out = run(RLMESH + EVAL_TINY + ["generator.replicas=1", "trainer.total_steps=320", "eval.every=64",
                                    "buffer=on_policy"], tmp_path, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    (db,) = runs_in(tmp_path)
    last_version = q(db, "SELECT max(policy_version) FROM train_steps")[0][0]
    evals = q(db, "SELECT policy_version, count(*) FROM evals GROUP BY 1 ORDER BY 1")
    assert evals[-1] == (last_version, 1) and all(n == 1 for _, n in evals), evals


@pytest.mark.timeout(60)
def test_bad_config_fails_before_any_proc_starts(tmp_path):
    out = run(RLMESH + ["recipe=ppo_cartpole", "trainer.lrr=1e-4"], tmp_path)
    assert out.returncode == 2
    assert "config error: trainer.lrr is not a config key: did you mean trainer.lr?" in out.stderr
    out = run(RLMESH + ["recipe=ppo_cartpole", "generator.num_envs=1", "generator.num_steps=2",
                        "trainer.num_minibatches=8"], tmp_path)
    assert out.returncode == 2 and "trainer.num_minibatches=8 is invalid" in out.stderr
    assert not (tmp_path / "runs").exists()                 # no run started, so no proc either


@pytest.mark.timeout(240)
def test_multirun_sweep(tmp_path):
    out = run(RLMESH + ["-m", *PPO_TINY, "generator.replicas=1", "trainer.total_steps=64", "eval.every=0",
                        "trainer.lr=1e-3,2e-3"],
              tmp_path, timeout=230)
    assert out.returncode == 0, out.stderr[-3000:]
    dbs = runs_in(tmp_path)
    assert len(dbs) == 2
    lrs = sorted(json.loads(q(db, "SELECT config FROM runs")[0][0])["trainer"]["lr"] for db in dbs)
    assert lrs == [1e-3, 2e-3]
