"""``workspace.sync=true`` on a real ``rlmesh run`` with local procs: a reward class from the user's own
project folder (not installed, not on any path) and its data file reach the workers through the sync,
before any actor exists; without the option the same run is a config error naming the key."""

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
RLMESH = [sys.executable, "-m", "rlmesh.cli", "run"]
GRPO_TINY = ["recipe=grpo_addition", "buffer=on_policy", "steps=1", "prompts_per_step=4", "generator.samples_per_prompt=2",
             "trainer.sft_steps=1", "trainer.max_groups=null", "eval.every=0", "eval.episodes=2", "model.d_model=16",
             "model.n_layers=1", "model.n_heads=2", "telemetry.health_interval_s=0", "run.progress=false"]
REWARD = '''import os

from rlmesh.rl.actors import RewardActor

BONUS = float(open(os.path.join(os.path.dirname(__file__), "bonus.txt")).read())  # a data file of the package


class MarkedReward(RewardActor):
    """Says where it was imported from, then scores as exact_match does, plus the data file's bonus."""

    def __init__(self, config=None):
        super().__init__(config)
        with open(os.environ["WS_MARKER"], "a") as f:
            f.write(f"{__file__} {BONUS}\\n")
'''


def rlmesh_run(args: list[str], cwd: Path, marker: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env.update(PYTHONPATH=str(ROOT), WS_MARKER=str(marker))
    return subprocess.run([*RLMESH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(300)  # gross bound against a hang: ~60-130 s on the 2 shared cores
def test_recipe_reward_class_comes_from_the_synced_project(tmp_path):
    proj = tmp_path / "proj"
    (proj / "wsrecipe_rewards").mkdir(parents=True)
    (proj / "wsrecipe_rewards" / "__init__.py").write_text("")
    (proj / "wsrecipe_rewards" / "marked.py").write_text(REWARD)
    (proj / "wsrecipe_rewards" / "bonus.txt").write_text("0.25\n")
    marker, hosts = tmp_path / "marker.txt", tmp_path / "hosts"
    user = [*GRPO_TINY, "reward._target_=wsrecipe_rewards.marked.MarkedReward"]

    off = rlmesh_run(user, tmp_path, marker)  # the default for launcher=local: no sync, the class is not found
    assert off.returncode == 2 and "reward._target_='wsrecipe_rewards.marked.MarkedReward' cannot be imported" in \
        off.stderr, off.stderr[-2000:]

    on = rlmesh_run([*user, "workspace.sync=true", f"workspace.path={proj}", "workspace.simulate_hosts=true",
                     f"workspace.store_dir={tmp_path / 'stores'}", f"workspace.dest_root={hosts}"], tmp_path, marker)
    assert on.returncode == 0, on.stderr[-3000:]
    (db,) = {p.resolve() for p in (tmp_path / "runs").glob("2*/telemetry.duckdb")}
    run_id = db.parent.name
    # proc 2 holds the reward actor (recipes/grpo.py): it imported the class from its own host's copy
    assert marker.read_text().split() == [str(hosts / "host-2" / run_id / "wsrecipe_rewards" / "marked.py"), "0.25"]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT target_host, files, error FROM file_syncs ORDER BY target_host").fetchall()
        spans = {r[0] for r in con.execute("SELECT DISTINCT mesh FROM spans").fetchall()}
    # one row per proc (each its own simulated host): buffer+evaluator, trainer, reward, generator
    assert rows == [(f"proc-{i}", 3, "") for i in range(4)]
    assert "reward" in spans
