"""A recipe on pods whose "image" has rlmesh but not the user's package: the package, its data file and,
on a second run, a changed reward function arrive through the workspace sync (on by default for
``launcher=kubernetes``), against the real API server.

The fake kubelet runs pods as local processes sharing this machine's filesystem and hostname, so
``workspace.simulate_hosts=true`` makes each pod its own host (own chunk store and copy): the pods'
``PYTHONPATH`` holds only rlmesh and the test helpers, never the project folder.
"""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest

pytestmark = pytest.mark.timeout(400)

REWARD = '''import os

from rlmesh.rl.actors import RewardActor

SCALE = {scale}
BONUS = open(os.path.join(os.path.dirname(__file__), "bonus.txt")).read().strip()  # the package's data file


class PodReward(RewardActor):
    def __init__(self, config=None):
        super().__init__(config)
        with open(os.environ["RLMESH_WS_TEST_MARKER"], "a") as f:
            f.write(f"{{__file__}} {{SCALE}} {{BONUS}}\\n")
'''
GRPO_TINY = ["recipe=grpo_addition", "buffer=on_policy", "steps=1", "prompts_per_step=4", "generator.samples_per_prompt=2",
             "trainer.sft_steps=1", "trainer.max_groups=null", "eval.every=0", "eval.episodes=2", "model.d_model=16",
             "model.n_layers=1", "model.n_heads=2", "telemetry.health_interval_s=0", "run.progress=false",
             "reward._target_=wspod_rewards.scoring.PodReward"]


def run(k8s, tmp_path, name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLMESH_RUNS_DIR": str(tmp_path / "runs"), "RLMESH_WS_TEST_MARKER": str(tmp_path / "marker")}
    env.pop("RLMESH_JOB_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "rlmesh.cli", "run", *GRPO_TINY, "launcher=kubernetes", "launcher.image=rlmesh-test:local",
         f"launcher.namespace={k8s.namespace}", f"launcher.run={name}", f"launcher.kubeconfig={k8s.plane.admin_kubeconfig}",
         f"workspace.path={tmp_path / 'proj'}", "workspace.simulate_hosts=true",
         f"workspace.store_dir={tmp_path / 'stores'}", f"workspace.dest_root={tmp_path / 'pods'}"],
        capture_output=True, text=True, timeout=190, env=env, cwd=tmp_path)


def syncs(tmp_path) -> list[list[tuple]]:
    out = []
    for db in sorted((tmp_path / "runs").glob("2*/telemetry.duckdb")):
        with duckdb.connect(str(db), read_only=True) as con:
            out.append(con.execute("SELECT target_host, bytes_sent, chunks_deduplicated, error FROM file_syncs "
                                   "ORDER BY target_host").fetchall())
    return out


def test_package_data_and_changed_reward_reach_pods(k8s, tmp_path):
    pkg = tmp_path / "proj" / "wspod_rewards"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bonus.txt").write_text("data-file-ok\n")
    (pkg / "scoring.py").write_text(REWARD.format(scale=1))
    first = run(k8s, tmp_path, "it-ws-1")
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]

    (pkg / "scoring.py").write_text(REWARD.format(scale=22))  # the edit between two runs
    second = run(k8s, tmp_path, "it-ws-2")
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]

    lines = [ln.split() for ln in (tmp_path / "marker").read_text().splitlines()]
    assert [(scale, bonus) for _, scale, bonus in lines] == [("1", "data-file-ok"), ("22", "data-file-ok")]
    for path, _, _ in lines:  # imported from the pod's own copy (proc 2 holds the reward actor), not the project
        assert path.startswith(str(tmp_path / "pods" / "host-2")) and path.endswith("wspod_rewards/scoring.py"), path
    one, two = syncs(tmp_path)
    assert len(one) == len(two) == 4 and all(err == "" for rows in (one, two) for *_, err in rows)
    size = len(REWARD.format(scale=22).encode())
    # the second run sent each pod only the changed file; bonus.txt's chunk was already in its store
    # (an empty __init__.py has no chunk)
    assert [(sent, dedup) for _, sent, dedup, _ in one] == [(len(REWARD.format(scale=1).encode()) + len(b"data-file-ok\n"), 0)] * 4
    assert [(sent, dedup) for _, sent, dedup, _ in two] == [(size, 1)] * 4
