"""The headline of the launcher: the same recipe on a cluster with ``launcher=kubernetes``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlmesh.launch.kubernetes.manifests import run_selector

pytestmark = pytest.mark.timeout(180)


def test_ppo_recipe_runs_on_pods_and_leaves_nothing(k8s, tmp_path):
    env = {**os.environ, "RLMESH_RUNS_DIR": str(tmp_path)}
    env.pop("RLMESH_JOB_ID", None)  # a fresh controller, not this test process's
    out = subprocess.run(
        [sys.executable, "-m", "rlmesh.cli", "run", "recipe=ppo_cartpole", "launcher=kubernetes",
         "launcher.image=rlmesh-test:local", f"launcher.namespace={k8s.namespace}", "launcher.run=it-recipe",
         f"launcher.kubeconfig={k8s.plane.admin_kubeconfig}", "trainer.total_steps=1024", "eval.every=512",
         "eval.episodes=2"], capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "train steps" in out.stdout and "weight syncs" in out.stdout
    scheduled = {e.involved_object.name for e in k8s.core.list_namespaced_event(k8s.namespace).items
                 if e.reason == "Scheduled" and e.involved_object.name.startswith("it-recipe-")}
    assert len(scheduled) >= 3, scheduled  # buffer/evaluator, trainer, generator: each proc was a pod
    sel = run_selector("it-recipe")
    assert not k8s.core.list_namespaced_pod(k8s.namespace, label_selector=sel).items
    assert not k8s.core.list_namespaced_secret(k8s.namespace, label_selector=sel).items
