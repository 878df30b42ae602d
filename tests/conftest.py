"""Shared test settings: quick heartbeats so death detection tests stay fast, logs visible on failure."""

import os

import pytest

os.environ.setdefault("RLMESH_LOG_LEVEL", "WARNING")
# Runs written by tests go to a temporary folder, never into the checkout.
if "RLMESH_RUNS_DIR" not in os.environ:
    import tempfile

    os.environ["RLMESH_RUNS_DIR"] = tempfile.mkdtemp(prefix="rlmesh-test-runs-")


# The heaviest test files first (seconds on a quiet 2-core machine, from `--durations`, 5 Dec 2026,
# once each test no longer started a start-up template of its own: rlmesh.launch.starters).
# scripts/test.sh runs files on two xdist workers with `--no-loadscope-reorder`, so this order is
# the order files are handed out: with the long ones first, the two workers finish together instead
# of one running the chaos recipes alone at the end (xdist's default order is by number of tests,
# which put these few-but-long files last). Files not listed keep their place after these.
_HEAVY_FILES = {
    "tests/integration/recipes/test_chaos.py": 117,
    "tests/integration/vllm/test_vllm_real_model.py": 150,
    "tests/integration/llm/test_real_model.py": 110,
    "tests/integration/recipes/test_algorithms.py": 80,
    "tests/integration/recipes/test_off_policy_recipes.py": 11,
    "tests/integration/benchmarks/test_smoke_a.py": 90,  # every benchmark's --smoke, in two halves
    "tests/integration/benchmarks/test_smoke_b.py": 90,
    "tests/integration/vllm/test_vllm_backend.py": 55,
    "tests/integration/recipes/test_recipes.py": 48,
    "tests/integration/recipes/test_sweep.py": 34,
    "tests/integration/observe/test_observe.py": 33,
    "tests/integration/chaos/test_supervision.py": 30,
    "tests/integration/chaos/test_random_kills.py": 30,
    "tests/integration/actor/test_forkserver.py": 26,
    "tests/integration/rl/test_agentic.py": 24,
    "tests/integration/dashboard/test_browser.py": 23,
    "tests/integration/slurm/test_slurm.py": 60,
    "tests/integration/kubernetes/test_workspace.py": 23,
    "tests/integration/actor/test_faults.py": 18,
    "tests/integration/vllm/test_agentic_vllm.py": 18,
    "tests/integration/recipes/test_resume_bookkeeping.py": 16,
    "tests/integration/recipes/test_docs.py": 14,
    "tests/integration/recipes/test_plugins.py": 13,
    "tests/integration/kubernetes/test_launch.py": 13,
    "tests/integration/recipes/test_examples.py": 13,
    "tests/integration/recipes/test_new_algorithm.py": 12,
    "tests/integration/weights/test_stress.py": 11,
    "tests/integration/packaging/test_wheel.py": 11,
    "tests/integration/recipes/test_workspace_option.py": 10,
    "tests/integration/rl/test_actors.py": 10,
    "tests/integration/kubernetes/test_recipe.py": 9,
    "tests/integration/kubernetes/test_docs.py": 7,
    "tests/integration/kubernetes/test_errors.py": 4,
}


# One unit of work, not one per file: the Kubernetes tests share one real control plane, which takes
# ~5 s to start and ~3 % of a core while it idles. Together, on one xdist worker, one cluster serves
# them all and stops after the last (tests/integration/kubernetes/conftest.py); one per file's worker
# meant two clusters, each idling on to the end of the session.
_TOGETHER = "tests/integration/kubernetes/"


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or ``_TOGETHER`` for the Kubernetes files."""
    path = nodeid.split("::", 1)[0]
    return _TOGETHER if path.startswith(_TOGETHER) else path


def _weight(unit: str) -> int:
    if unit == _TOGETHER:
        return sum(w for f, w in _HEAVY_FILES.items() if f.startswith(_TOGETHER))
    return _HEAVY_FILES.get(unit, 0)


def pytest_collection_modifyitems(config, items):
    """Heaviest units first (a stable sort: each file's tests stay together and in order, and the
    Kubernetes files stay next to each other, as collected)."""
    items.sort(key=lambda item: -_weight(_unit(item.nodeid)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: no error when it is not loaded
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (scripts/test.sh), with the Kubernetes files as one unit, so one worker runs
    them all in a row."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # only where xdist runs the session

    class _FileOrTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return _FileOrTogether(config, log)
