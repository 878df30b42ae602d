"""Shared test settings: quick heartbeats so death detection tests stay fast, logs visible on failure."""

import os

os.environ.setdefault("RLMESH_LOG_LEVEL", "WARNING")
# Runs written by tests go to a temporary folder, never into the checkout.
if "RLMESH_RUNS_DIR" not in os.environ:
    import tempfile

    os.environ["RLMESH_RUNS_DIR"] = tempfile.mkdtemp(prefix="rlmesh-test-runs-")
