"""docs/extending.md's promise, end to end: a new algorithm is one Python file and one YAML, for a gym
algorithm (``examples/algorithms/mc_ppo.py``) and an LLM one (``examples/algorithms/reinforce_addition.py``),
run by ``rlmesh run`` with nothing in rlmesh edited: the module is named in ``$RLMESH_ALGORITHMS``, the
recipe YAML is found through ``hydra.searchpath``, and the trainer class that trains is the file's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "algorithms"


def run_algorithm(module: str, recipe: str, overrides: list[str], cwd: Path) -> tuple[dict, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    env.update(PYTHONPATH=os.pathsep.join([str(EXAMPLES), str(ROOT)]), RLMESH_ALGORITHMS=module,
               RLMESH_RUNS_DIR=str(cwd / "runs"))
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", f"recipe={recipe}",
                          f"hydra.searchpath=[file://{EXAMPLES / 'conf'}]", "telemetry.health_interval_s=0",
                          "run.progress=false", *overrides], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    (db,) = (cwd / "runs").glob("2*/telemetry.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
        metrics = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM train_steps ORDER BY step").fetchall()]
    return config, metrics


@pytest.mark.timeout(300)
def test_a_gym_algorithm_is_one_file_and_one_yaml(tmp_path):
    config, metrics = run_algorithm("mc_ppo", "mc_ppo_cartpole", [
        "generator.num_envs=4", "generator.num_steps=16", "trainer.total_steps=384", "trainer.num_minibatches=2",
        "trainer.reward_scale=0.5", "eval.every=0", "eval.episodes=2", "eval.target=null"], tmp_path)
    assert config["trainer"]["_target_"] == "mc_ppo.MCPPOTrainer"
    assert config["trainer"]["mc_lambda"] == 0.9 and config["trainer"]["reward_scale"] == 0.5  # YAML, then CLI
    assert len(metrics) >= 6 and all(m["train/mc_lambda"] == 0.9 for m in metrics)         # its class trained


@pytest.mark.timeout(300)
def test_an_llm_algorithm_is_one_file_and_one_yaml(tmp_path):
    config, metrics = run_algorithm("reinforce_addition", "reinforce_addition", [
        "steps=3", "prompts_per_step=8", "generator.samples_per_prompt=4", "trainer.sft_steps=5",
        "trainer.max_groups=null", "eval.every=3", "eval.episodes=8", "model.d_model=32", "model.n_layers=1",
        "model.n_heads=2"], tmp_path)
    assert config["trainer"]["_target_"] == "reinforce_addition.ReinforceTrainer"
    assert config["trainer"]["scale_by_std"] is True
    assert len(metrics) == 3 and all(m["train/batch_baseline"] == 1.0 for m in metrics)
