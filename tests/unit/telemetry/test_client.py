"""The worker's sender when the service is gone: keeps running, says so once."""

import logging
import time

import pyarrow as pa

from rlmesh.telemetry import client
from rlmesh.transport import Authenticator


def test_unreachable_service_warns_once_and_never_blocks(caplog, monkeypatch):
    monkeypatch.setattr(client, "WARN_AFTER_S", 0.1)
    sink = client.RemoteSink("tcp://127.0.0.1:9#m" + "00" * 16, Authenticator(b"k" * 32), "test")  # nothing listens on 9
    batch = [("mine", pa.table({"a": [1, 2]}))]
    with caplog.at_level(logging.WARNING, logger="rlmesh.telemetry.client"):
        t0 = time.perf_counter()
        for _ in range(20):
            sink(batch)
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1
    assert elapsed < 2.0
    assert sink.backlog_rows == 40
    sink.close(timeout=0.1)


def test_backlog_is_bounded(monkeypatch):
    monkeypatch.setattr(client, "MAX_BACKLOG_ROWS", 10)
    sink = client.RemoteSink("tcp://127.0.0.1:9#m" + "00" * 16, Authenticator(b"k" * 32), "test")
    for _ in range(10):
        sink([("mine", pa.table({"a": [1, 2, 3]}))])
    assert sink.backlog_rows <= 12 and sink.dropped_rows >= 18
    sink.close(timeout=0.1)


def test_big_batches_are_split_into_bounded_messages(monkeypatch):
    monkeypatch.setattr(client, "MAX_ROWS_PER_MESSAGE", 100)
    msgs = client.split_messages([("a", pa.table({"x": list(range(250))})), ("b", pa.table({"y": [1] * 30}))])
    sizes = [sum(t.num_rows for _, t in m) for m in msgs]
    assert sizes == [100, 100, 80] and all(s <= 100 for s in sizes)
    assert [n for n, _ in msgs[-1]] == ["a", "b"]
    assert sum(t.column(0).to_pylist() == list(range(200, 250)) for m in msgs for n, t in m if n == "a") == 1


def test_raw_rows_of_a_small_flush_travel_whole_beside_arrow_batches(monkeypatch):
    """A small flush's plain rows (RawRows) are never sliced; they count toward a message's rows."""
    from rlmesh.telemetry.wire import RawRows

    monkeypatch.setattr(client, "MAX_ROWS_PER_MESSAGE", 100)
    raw = RawRows([(0.0, ("m", 0, "p", "h"), {"x": i}) for i in range(30)], {"x": "BIGINT"})
    msgs = client.split_messages([("a", pa.table({"x": list(range(90))})), ("r", raw)])
    assert [[(n, b.num_rows) for n, b in m] for m in msgs] == [[("a", 90), ("r", 30)]]
    assert msgs[0][1][1] is raw
