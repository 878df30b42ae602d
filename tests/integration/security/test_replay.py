"""Replay: frames captured from a live run and re-sent to every listening socket run nothing and store nothing.

Without per-session counters and call-id dedup, replaying the captured ``add`` calls
re-ran them (the totals grew) and replayed telemetry batches inserted rows again.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.timeout(600)
def test_replayed_frames_are_never_executed_or_stored_twice(tmp_path):
    env = {**os.environ, "RLMESH_RUNS_DIR": str(tmp_path / "runs"), "RLMESH_HEARTBEAT_TIMEOUT_S": "60"}
    env.pop("RLMESH_SECRET", None)
    tapdir = tmp_path / "tap"
    tapdir.mkdir()
    proc = subprocess.run([sys.executable, os.path.join(HERE, "replay_scenario.py"), str(tapdir)], env=env,
                          capture_output=True, text=True, timeout=540)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1])
    assert r["captured"] > 20 and {"DEALER", "ROUTER", "PUSH"} <= set(r["kinds"]), r  # calls, replies, batches
    assert r["before"] == {"a": 115, "b": 100, "rows": {"n": 8, "k": 215}}
    assert r["after"] == r["before"], f"a replay ran a call or stored a row again: {r}"
    assert r["refused"] >= r["sent"], r  # every replayed message was dropped and counted
    assert r["still"] == 116  # and the run goes on serving its real callers
    assert "telemetry ingest" in r["refusal_channels"], r  # the counts are rows of the run's `refusals` table


@pytest.mark.timeout(120)
def test_a_batch_stored_once_even_if_two_sessions_deliver_it(tmp_path):
    """Ingest is idempotent by (sender id, batch seq), below the transport's own counters.

    Each message is sent only once the service has handled the one before: messages from
    different sockets have no order between them (a later socket's connection can be up first
    on a busy machine), and a sender's batches always travel in order through its one socket."""
    import time

    import pyarrow as pa
    import zmq

    from rlmesh.telemetry import wire
    from rlmesh.telemetry.client import ask
    from rlmesh.telemetry.service import TelemetryService
    from rlmesh.transport import Authenticator, connect_channel

    auth = Authenticator(Authenticator.new_secret())
    svc = TelemetryService(tmp_path, "r1", auth).start()
    try:
        ctx = zmq.Context.instance()
        batch = [("tally", pa.table({"k": [1, 2, 3]}))]
        acked = lambda: int(ask(svc.query_addr, auth, "acked", "sender-a")[0])  # noqa: E731 - newest seq stored
        # the same batch key through fresh sessions: stored once each; (seq sent, newest stored, duplicates)
        for seq, stored, duplicates in ((1, 1, 0), (1, 1, 1), (2, 2, 1), (1, 2, 2)):
            push = ctx.socket(zmq.PUSH)
            out = connect_channel(push, auth, svc.ingest_addr)
            push.send_multipart(wire.encode_batches(out, "gen.0", batch, ("sender-a", seq)))
            push.close(linger=2000)
            deadline = time.monotonic() + 60
            while svc.duplicate_batches < duplicates or acked() < stored:
                assert time.monotonic() < deadline, f"the service did not handle the batch with seq {seq}"
                time.sleep(0.05)
            assert svc.duplicate_batches == duplicates
            assert acked() == stored
        svc.sync()
        assert svc.query("SELECT count(*) AS n FROM tally").to_pylist() == [{"n": 6}]
    finally:
        svc.stop()


@pytest.mark.timeout(300)
def test_an_actor_runs_a_call_id_once_even_through_fresh_sessions():
    """Defence in depth: the same (caller inbox, call id) delivered by two valid sessions runs once."""
    import time

    import zmq

    import rlmesh as rm
    from rlmesh.actor import protocol as P
    from rlmesh.actor.controller import Controller
    from rlmesh.transport import connect_channel, dumps
    from replay_actors import Tally

    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        tally = procs.spawn("tally", Tally)
        assert tally.add.call_one(1).get(timeout=60) == 1
        ctl = Controller.current()
        addr = ctl.procs[procs.proc_ids[0]].addr
        actor_id = tally._point(0).actor_id
        call_id = next(ctl.client._ids)  # an id the caller reserved (it will never use it itself)
        meta = (P.CAST, call_id, actor_id, "add", "controller", ctl.client.inbox_addr)
        for _ in range(3):  # each through a fresh, genuine session: the transport lets all three in
            s = zmq.Context.instance().socket(zmq.DEALER)
            out = connect_channel(s, ctl.auth, addr)
            s.send_multipart(P.encode(out, meta, dumps(((10,), {}))))
            s.close(linger=2000)
        deadline = time.monotonic() + 60
        while (v := tally.value.call_one().get(timeout=60)) != 11:
            assert time.monotonic() < deadline, f"total {v}: the cast ran {(v - 1) // 10} times, not once"
            time.sleep(0.05)
        assert tally.add.call_one(0).get(timeout=60) == 11  # ran once, not three times
