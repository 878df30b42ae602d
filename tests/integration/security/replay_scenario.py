"""A live run, wiretapped, then every captured frame replayed to every listening socket of the run.

Run by test_replay.py as ``python replay_scenario.py TAPDIR``; prints one JSON line with
the state before and after the replay. Frames come from the controller and both
worker procs: calls (controller -> actor, actor -> actor), casts, replies, control
messages and telemetry batches.
"""

import json
import os
import sys
import time

import zmq

import tap  # beside this script, which python puts first on sys.path (and the workers inherit it)
from replay_actors import Tally

import rlmesh as rm
from rlmesh.actor import hooks
from rlmesh.actor.controller import Controller
from rlmesh.telemetry import api


def wait_for(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def main(tapdir: str) -> None:
    os.environ["RLMESH_TEST_TAP_DIR"] = tapdir
    hooks.register_controller_plugin("tap:controller_plugin")
    tap.install()
    rm.telemetry.start_run()
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        tallies = procs.spawn("tally", Tally)
        a, b = tallies.slice(procs=0), tallies.slice(procs=1)
        for _ in range(5):
            a.add.call_one(1).get(timeout=60)
        b.relay.call_one(a, 10).get(timeout=60)  # b's proc calls a: a worker's call and reply
        tallies.add.broadcast(100)  # casts
        wait_for(lambda: a.value.call_one().get(timeout=60) == 115 and b.value.call_one().get(timeout=60) == 100,
                 what="the casts")
        tallies.flush.call().get(timeout=60)

        def rows():
            return rm.telemetry.query("SELECT count(*) AS n, CAST(sum(k) AS BIGINT) AS k FROM tally").to_pylist()[0]

        wait_for(lambda: rows()["n"] == 8, what="8 tally rows")
        tap.uninstall()  # stop capturing here; workers keep appending, but we read the files now
        captured = tap.read_all(tapdir)
        before = {"a": a.value.call_one().get(timeout=60), "b": b.value.call_one().get(timeout=60), "rows": rows()}

        ctl = Controller.current()
        routers = [ctl.addr, ctl.client.inbox_addr, api.service().query_addr]
        routers += [ctl.procs[p].addr for p in procs.proc_ids]
        routers += tallies.inbox.call().get(timeout=60).values()  # each worker's own reply inbox
        listening = [(zmq.DEALER, r) for r in dict.fromkeys(routers)] + [(zmq.PUSH, api.service().ingest_addr)]

        def refusals() -> int:
            here = -1
            try:
                from rlmesh.transport import refusal_stats

                here = sum(c.total for c in refusal_stats().values())
            except ImportError:
                pass
            there = sum(tallies.refusals.call().get(timeout=60).values())
            return here + there

        refused0 = refusals()
        ctx = zmq.Context()
        sent = 0
        kinds: dict[str, int] = {}
        for sock_type, addr in listening:
            s = ctx.socket(sock_type)
            s.setsockopt(zmq.LINGER, 2000)
            s.connect(addr.partition("#")[0])  # a new peer, on the bare endpoint: no keys, just the bytes
            for typ, frames in captured:
                body = frames[1:] if typ == zmq.ROUTER else frames  # a ROUTER's first frame is the route
                if body:
                    s.send_multipart(body)
                    sent += 1
                    kinds[zmq.SocketType(typ).name] = kinds.get(zmq.SocketType(typ).name, 0) + 1
            s.close()
        if refused0 >= 0:
            wait_for(lambda: refusals() - refused0 >= sent, timeout=120, what=f"{sent} refusals")
        else:  # the code before the defences counts nothing: give the replays time to land
            time.sleep(5)
        tallies.flush.call().get(timeout=60)
        after = {"a": a.value.call_one().get(timeout=60), "b": b.value.call_one().get(timeout=60), "rows": rows()}
        still = a.add.call_one(1).get(timeout=60)

        def refusal_channels():
            try:
                got = rm.telemetry.query("SELECT DISTINCT channel FROM refusals").to_pylist()
            except Exception:  # the table appears with its first row
                return None
            names = sorted(r["channel"] for r in got)
            return names if any(n.startswith("actor calls to") for n in names) and "controller" in names else None

        if refused0 >= 0:
            channels = wait_for(refusal_channels, what="refusals rows from the controller and the workers")
        else:
            channels = []
        print(json.dumps({"captured": len(captured), "sent": sent, "kinds": kinds, "listening": len(listening),
                          "refused": refusals() - refused0, "before": before, "after": after, "still": still,
                          "refusal_channels": channels}))


if __name__ == "__main__":
    main(sys.argv[1])
