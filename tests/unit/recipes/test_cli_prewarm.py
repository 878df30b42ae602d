"""When ``rlmesh run`` starts the procs' template before composing: only for a local run whose
command line leaves the workspace sync alone (that sync changes ``sys.path``, so the procs' env)."""

import pytest

from rlmesh.recipes.cli import local_without_workspace


@pytest.mark.parametrize("argv, early", [
    ([], True),
    (["recipe=ppo_cartpole", "trainer.lr=1e-3"], True),
    (["launcher=local", "run.seed=1"], True),
    (["launcher=k8s"], False),
    (["+launcher=k8s"], False),
    (["workspace.sync=true"], False),
    (["recipe=ppo_cartpole", "+workspace.path=/src"], False),
    (["telemetry.runs_dir=/tmp/x"], True),
])
def test_early_start_only_for_a_local_run_without_workspace_overrides(argv, early):
    assert local_without_workspace(argv) is early
