"""Each test gets its own runs directory and a process with no run going."""

from __future__ import annotations

import pytest


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLMESH_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RLMESH_HEALTH_INTERVAL", "0.2")
    for var in ("RLMESH_TELEMETRY_ADDR", "RLMESH_TELEMETRY_QUERY_ADDR", "RLMESH_RUN_ID", "RLMESH_TELEMETRY"):
        monkeypatch.delenv(var, raising=False)
    from rlmesh.telemetry import api

    api.end_run()
    yield tmp_path / "runs"
    api.end_run()
