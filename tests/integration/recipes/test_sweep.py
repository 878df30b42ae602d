"""``rlmesh run -m`` as Hydra users expect it: jobs keep ``hydra.searchpath``, each job folder and its run
point at each other, the sweep ends with one table and a database across its runs, failed jobs make the
sweep fail under any launcher, and Optuna optimises the recipe's objective (its final evaluation)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
TINY = ["generator.replicas=1", "generator.num_envs=2", "generator.num_steps=16", "trainer.total_steps=64",
        "trainer.num_minibatches=2", "trainer.update_epochs=1", "eval.every=0", "eval.episodes=2", "eval.target=null",
        "telemetry.health_interval_s=0", "run.progress=false"]


def rlmesh_run(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    env["PYTHONPATH"] = str(ROOT)
    env["RLMESH_RUNS_DIR"] = str(cwd / "runs")
    return subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def sweep_dir(cwd: Path) -> Path:
    (d,) = (cwd / "runs" / "hydra").glob("multirun-*")
    return d


@pytest.mark.timeout(420)
def test_sweep_keeps_the_search_path_links_jobs_and_runs_and_summarises(tmp_path):
    conf = tmp_path / "my_configs" / "recipe"
    conf.mkdir(parents=True)
    (conf / "my_cartpole.yaml").write_text("# @package _global_\ndefaults:\n  - ppo_cartpole\n  - _self_\n"
                                           "trainer:\n  gamma: 0.97\n")
    out = rlmesh_run(["-m", "recipe=my_cartpole", f"hydra.searchpath=[file://{tmp_path / 'my_configs'}]", *TINY,
                      "trainer.lr=1e-3,2e-3"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    d = sweep_dir(tmp_path)
    with duckdb.connect(str(d / "telemetry.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT job, overrides, status, run_id, final_eval, run_dir, hydra_dir FROM summary").fetchall()
    assert [r[0] for r in rows] == [0, 1] and all(r[2] == "ok" and r[4] is not None for r in rows), rows
    assert "trainer.lr=0.001" in rows[0][1] and "trainer.lr=0.002" in rows[1][1]
    for job, _, _, run_id, final, run_dir, hydra_dir in rows:
        link = json.loads((Path(hydra_dir) / "rlmesh_run.json").read_text())          # job folder -> run
        assert link["run_id"] == run_id and Path(link["run_dir"]) == Path(run_dir)
        back = json.loads((Path(run_dir) / "hydra_job.json").read_text())            # run -> job folder
        assert Path(back["job_dir"]) == Path(hydra_dir).resolve()
        with duckdb.connect(str(Path(run_dir) / "telemetry.duckdb"), read_only=True) as con:
            config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
            newest = con.execute("SELECT value FROM evals ORDER BY policy_version DESC LIMIT 1").fetchone()[0]
        assert config["trainer"]["gamma"] == 0.97                                       # the user's recipe, found
        assert final == pytest.approx(newest)
    assert "Query this sweep: rlmesh sql" in out.stdout and "final eval" in out.stdout


@pytest.mark.timeout(420)
def test_failed_jobs_fail_the_sweep_under_joblib(tmp_path):
    out = rlmesh_run(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "recipe=ppo_cartpole", *TINY,
                      "trainer.lr=-1,-2"], tmp_path)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "trainer.lr=-1.0 is invalid" in out.stderr and "2 of 2 sweep jobs failed" in out.stderr
    with duckdb.connect(str(sweep_dir(tmp_path) / "telemetry.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status FROM jobs ORDER BY job").fetchall() == [("config error",)] * 2


@pytest.mark.timeout(500)
def test_optuna_optimises_the_final_evaluation(tmp_path):
    out = rlmesh_run(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=maximize",
                      "hydra.sweeper.sampler.seed=0", "recipe=ppo_cartpole", *TINY, "trainer.lr=interval(1e-4,3e-3)"],
                     tmp_path, timeout=480)
    assert out.returncode == 0, out.stderr[-3000:]
    d = sweep_dir(tmp_path)
    best = yaml.safe_load((d / "optimization_results.yaml").read_text())
    with duckdb.connect(str(d / "telemetry.duckdb"), read_only=True) as con:
        finals = [r[0] for r in con.execute("SELECT final_eval FROM summary").fetchall()]
    assert len(finals) == 2 and None not in finals
    assert best["best_value"] == pytest.approx(max(finals))                 # Optuna saw the recipe's objective
