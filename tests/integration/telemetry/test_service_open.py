"""The telemetry service opens its DuckDB file on its own thread: nothing is lost or refused meanwhile.

``TelemetryService.start`` binds the sockets and returns; loading DuckDB and opening the file
(~0.3 s of CPU) overlaps the first procs' start. Rows recorded and queries asked before the file
is open must land and be answered; a service stopped before it is open must still finish its run;
a file that cannot be opened must say so, not hang the callers.
"""

import contextlib
import json
import threading
import time

import pytest

from rlmesh.telemetry import run as runs
from rlmesh.telemetry.errors import TelemetryError
from rlmesh.telemetry.recorder import Recorder
from rlmesh.telemetry.service import TelemetryService
from rlmesh.transport import Authenticator


def held(gate: threading.Event):
    """An ``importing`` hook that holds the service's opener before its imports until ``gate`` is set."""

    @contextlib.contextmanager
    def importing():
        gate.wait()
        yield

    return importing


@pytest.fixture
def auth():
    return Authenticator(Authenticator.new_secret())


@pytest.mark.timeout(120)
def test_rows_and_queries_before_the_file_is_open_are_kept_and_answered(tmp_path, auth):
    gate = threading.Event()  # it holds the opener at its imports: "not open yet", for sure
    svc = TelemetryService(tmp_path, "r1", auth, importing=held(gate))
    svc.start()
    assert svc.ingest_addr and svc.query_addr  # what procs need, before the file is open
    rec = Recorder("r1", svc.ingest, flush_interval=60)
    for i in range(3):
        rec.record("early", {"step": i})
    rec.flush()
    assert not svc.sync(timeout=0.2)  # queued: the file is not open
    gate.set()
    try:
        assert svc.sync(timeout=60)
        assert svc.query("SELECT sum(step) AS s FROM early").column(0)[0].as_py() == 3
    finally:
        rec.close()
        svc.stop()
    info = runs.read_json(tmp_path / runs.RUN_JSON)
    assert info["status"] == "ok" and info["rows"] == 3


@pytest.mark.timeout(120)
def test_a_service_stopped_while_its_file_opens_finishes_its_run(tmp_path, auth):
    gate = threading.Event()
    svc = TelemetryService(tmp_path, "r2", auth, config={"lr": 0.1}, importing=held(gate)).start()
    threading.Timer(0.3, gate.set).start()  # stop() below starts while the opener is held
    svc.stop("ok")
    from rlmesh.telemetry.store import open_read_only, execute_read_only

    con = open_read_only({"r": tmp_path / runs.DB_NAME})
    try:
        rows = execute_read_only(con, "SELECT status, config FROM runs", catalog="r").to_pylist()
    finally:
        con.close()
    assert [(r["status"], json.loads(r["config"])) for r in rows] == [("ok", {"lr": 0.1})]
    assert not (tmp_path / runs.SERVICE_JSON).exists()


@pytest.mark.timeout(120)
def test_a_config_set_while_the_file_opens_is_stored(tmp_path, auth):
    gate = threading.Event()
    svc = TelemetryService(tmp_path, "r3", auth, importing=held(gate)).start()
    svc.set_config({"seed": 7})  # the opener is held: kept for it
    gate.set()
    try:
        got = svc.query("SELECT config FROM runs").column(0)[0].as_py()
    finally:
        svc.stop()
    assert json.loads(got) == {"seed": 7}


@pytest.mark.timeout(60)
def test_a_file_that_cannot_be_opened_is_said_and_nobody_waits_for_it(tmp_path, auth):
    (tmp_path / runs.DB_NAME).mkdir()  # a directory where the database should be
    svc = TelemetryService(tmp_path, "r4", auth).start()
    t0 = time.monotonic()
    with pytest.raises(TelemetryError, match="could not open .*telemetry"):
        svc.query("SELECT 1")
    assert svc.ingest([("t", object())]) == 0  # rows are dropped, not queued forever
    assert svc.sync(timeout=30) is False
    svc.stop("failed", "x")
    assert time.monotonic() - t0 < 20  # none of these waited out its timeout
