import os
import socket

import pytest

from rlmesh.telemetry import run as runs
from rlmesh.telemetry.errors import RunNotFoundError


def _make(root, run_id, status="ok", pid=None):
    d = runs.create_run_dir(run_id, root)
    (d / runs.DB_NAME).write_bytes(b"")
    runs.write_json(d / runs.RUN_JSON, {"id": run_id, "status": status, "pid": pid or os.getpid(),
                                        "host": socket.gethostname(), "start_ts": 1.0, "end_ts": 2.0})
    return d


def test_latest_points_at_newest_and_resolves(runs_dir):
    a = _make(runs_dir, "20260101-000000-aaaa")
    b = _make(runs_dir, "20260101-000001-bbbb")
    assert os.readlink(runs_dir / "latest") == b.name
    assert runs.resolve_run(None) == b.resolve()
    assert runs.resolve_run("latest") == b.resolve()
    assert runs.resolve_run(a.name) == a.resolve()
    assert runs.resolve_run(str(a)) == a.resolve()
    assert runs.resolve_run(str(a / runs.DB_NAME)) == a.resolve()


def test_unknown_run_error_lists_recent_runs(runs_dir):
    _make(runs_dir, "20260101-000000-aaaa")
    with pytest.raises(RunNotFoundError, match="20260101-000000-aaaa"):
        runs.resolve_run("nope")


def test_running_run_whose_controller_is_gone_is_crashed(runs_dir):
    _make(runs_dir, "20260101-000000-dead", status="running", pid=2**22 + 12345)
    _make(runs_dir, "20260101-000001-live", status="running")
    status = {r["id"]: r["status"] for r in runs.list_runs(runs_dir)}
    assert status == {"20260101-000000-dead": "crashed", "20260101-000001-live": "running"}


def test_service_file_is_private(runs_dir):
    d = _make(runs_dir, "20260101-000000-priv")
    runs.write_json(d / runs.SERVICE_JSON, {"secret": "00"}, private=True)
    assert (d / runs.SERVICE_JSON).stat().st_mode & 0o077 == 0


def _dead_run(root, run_id, db_status):
    """A run whose controller died on this host: run.json says running, its pid is gone."""
    from rlmesh.telemetry.store import Store

    d = runs.create_run_dir(run_id, root)
    store = Store(d / runs.DB_NAME, run_id)
    store.execute_write("INSERT INTO runs (id, status) VALUES (?, ?)", [run_id, db_status])
    store.close()
    dead = {"id": run_id, "status": "running", "pid": 999_999_999, "host": socket.gethostname(), "start_ts": 1.0}
    runs.write_json(d / runs.RUN_JSON, dead)
    runs.write_json(d / runs.SERVICE_JSON, {**dead, "secret": "00"}, private=True)
    return d


def test_dead_runs_are_settled_so_runs_and_the_database_agree(runs_dir, capsys):
    """Issue 11 items 5 and 12: a stale service.json (it holds the secret) stayed after a crash, and
    a kill during close left run.json and the database disagreeing on the status."""
    import json

    import duckdb

    from rlmesh.telemetry.cli import runs_main

    crashed = _dead_run(runs_dir, "20260101-000000-aaaa", "running")     # killed mid-run
    closing = _dead_run(runs_dir, "20260101-000001-bbbb", "ok")          # killed between the DB row and run.json
    assert runs_main(["--format", "json"]) == 0
    shown = {r["id"]: r["status"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert shown == {crashed.name: "crashed", closing.name: "ok"}
    for d, want in ((crashed, "crashed"), (closing, "ok")):
        assert not (d / runs.SERVICE_JSON).exists()
        assert runs.read_json(d / runs.RUN_JSON)["status"] == want
        with duckdb.connect(str(d / runs.DB_NAME), read_only=True) as con:
            assert con.execute("SELECT status FROM runs").fetchall() == [(want,)]
