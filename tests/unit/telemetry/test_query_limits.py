"""Every query has a time limit, and DuckDB's interrupt stops it at the limit or when its client goes away."""

import threading
import time

import duckdb
import pytest

from rlmesh.telemetry import limits
from rlmesh.telemetry.client import remote_query
from rlmesh.telemetry.service import TelemetryService
from rlmesh.telemetry.store import execute_read_only
from rlmesh.transport import Authenticator

HOSTILE = "SELECT count(*) AS n, sum(a.range * b.range) AS s FROM range(1000000) a, range(1000000) b"


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_the_default_limit_stops_a_query_of_hours_and_names_the_setting(monkeypatch):
    monkeypatch.setenv("RLMESH_QUERY_TIMEOUT_S", "0.5")
    con = duckdb.connect(":memory:")
    with pytest.raises(limits.QueryTimeoutError) as err:
        execute_read_only(con, HOSTILE)
    assert "time limit of 0.5 s" in str(err.value) and "RLMESH_QUERY_TIMEOUT_S" in str(err.value)
    assert execute_read_only(con, "SELECT 1 AS one", timeout=30).column("one").to_pylist() == [1]  # the database goes on
    assert limits.in_flight() == 0


def test_a_limit_must_be_positive():
    with pytest.raises(ValueError, match="timeout=0"):
        limits.limit_for(0)


@pytest.mark.timeout(120)
def test_a_cancelled_scope_interrupts_its_query_at_once():
    con = duckdb.connect(":memory:")
    scope = limits.Scope()
    caught: list[BaseException] = []

    def run():
        with scope.active():
            try:
                execute_read_only(con, HOSTILE, timeout=3600)
            except BaseException as exc:  # noqa: BLE001
                caught.append(exc)

    th = threading.Thread(target=run)
    th.start()
    _wait(lambda: limits.in_flight() == 1, 30, "the query starts")
    scope.cancel("its client went away")
    th.join(60)
    assert not th.is_alive()
    assert isinstance(caught[0], limits.QueryCancelledError) and "client went away" in str(caught[0])


@pytest.mark.timeout(120)
def test_the_service_stops_a_query_whose_client_went_away(tmp_path):
    auth = Authenticator(Authenticator.new_secret())
    svc = TelemetryService(tmp_path, "r1", auth).start(wait=True)
    try:
        scope = limits.Scope()
        caught: list[BaseException] = []

        def client():
            with scope.active():
                try:
                    remote_query(svc.query_addr, auth, HOSTILE, timeout=3600)
                except BaseException as exc:  # noqa: BLE001
                    caught.append(exc)

        th = threading.Thread(target=client)
        th.start()
        _wait(lambda: len(svc._queries) == 1, 30, "the service runs the query")
        # meanwhile, other queries are answered
        assert remote_query(svc.query_addr, auth, "SELECT 1 AS one", timeout=30).column("one").to_pylist() == [1]
        scope.cancel("its client went away")  # the client stops waiting and says so
        th.join(60)
        assert isinstance(caught[0], limits.QueryCancelledError)
        _wait(lambda: not svc._queries, 30, "the service interrupts the query")
    finally:
        svc.stop()
