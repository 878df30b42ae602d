"""The telemetry service's ingest socket refuses a frame over ``RLMESH_MAX_MESSAGE_MB`` before
buffering it (issue 37): it reads before it authenticates, so without the limit anyone on the host
could make the controller hold a frame of any size. Legitimate senders split wide rows into
messages that fit. A real service and real zmq sockets, with the limit at 4 MiB."""

import time

import pyarrow as pa
import zmq

from rlmesh.telemetry import client, wire
from rlmesh.telemetry.client import ask, split_messages
from rlmesh.telemetry.service import TelemetryService
from rlmesh.transport import Authenticator, connect_channel, sockets

MiB = 1 << 20


def test_an_oversize_frame_is_dropped_unread_and_ingest_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(sockets, "_max_message", 4 * MiB)
    auth = Authenticator(Authenticator.new_secret())
    svc = TelemetryService(tmp_path, "r1", auth).start()
    ctx = zmq.Context.instance()
    try:
        raw = ctx.socket(zmq.PUSH)  # unauthenticated: one 16 MiB frame
        raw.setsockopt(zmq.LINGER, 0)
        mon = raw.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        raw.connect(svc.ingest_addr.split("#", 1)[0])
        raw.send(b"\x01" * (16 * MiB), copy=False)
        assert mon.poll(60_000), "the ingest socket did not drop the oversize frame's connection"
        raw.disable_monitor()
        raw.close(0)

        push = ctx.socket(zmq.PUSH)  # a legitimate sender still gets through
        out = connect_channel(push, auth, svc.ingest_addr)
        push.send_multipart(wire.encode_batches(out, "gen.0", [("tally", pa.table({"k": [1, 2]}))], ("s", 1)))
        deadline = time.monotonic() + 60
        while int(ask(svc.query_addr, auth, "acked", "s")[0]) < 1:  # stored: the newest batch it holds
            assert time.monotonic() < deadline, "the service stopped ingesting"
            time.sleep(0.05)
        push.close(linger=2000)
    finally:
        svc.stop()


def test_wide_rows_are_split_to_fit_the_limit(monkeypatch):
    monkeypatch.setattr(sockets, "_max_message", 4 * MiB)
    wide = pa.table({"text": ["x" * 10_000] * 1_000})  # ~10 MB
    parts = split_messages([("samples", wide), ("tally", pa.table({"k": [1]}))])
    assert sum(t.num_rows for msg in parts for _, t in msg) == 1_001
    assert len(parts) >= 10 and all(sum(t.nbytes for _, t in msg) <= client.message_budget() for msg in parts)
