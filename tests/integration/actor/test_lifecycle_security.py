"""Shutdown without orphans, __main__-defined actors, handles passed peer to peer, and auth refusal."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import zmq

import rlmesh as rm
from rlmesh.actor.client import get_client
from rlmesh.actor.controller import Controller
from runtime_actors import Counter, Relay
from proc_checks import gone, wait_gone  # noqa: E402

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))




def test_with_block_stops_every_proc():
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        procs.spawn("c", Counter).value.call().get(timeout=10)
        pids = procs.pids
    wait_gone(pids, 5)
    assert procs.states() == ["stopped"] * 3


CONTROLLER = textwrap.dedent("""
    import sys, time
    import rlmesh as rm

    class Pinger(rm.Actor):          # defined in __main__: must travel by value
        def __init__(self, word):
            self.word = word
        @rm.endpoint
        def ping(self):
            return self.word + "!"

    if __name__ == "__main__":
        procs = rm.this_host().spawn_procs(per_host={"procs": 2})
        print(procs.spawn("p", Pinger, "pong").ping.call().get(timeout=20).values(), flush=True)
        print(" ".join(map(str, procs.pids)), flush=True)
        time.sleep(600)
""")


def test_main_defined_actor_and_no_orphans_after_controller_sigkill(tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("RLMESH_SECRET", None)
    env.pop("RLMESH_JOB_ID", None)
    ctl = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert ctl.stdout.readline().strip() == "['pong!', 'pong!']"
        pids = [int(p) for p in ctl.stdout.readline().split()]
        assert len(pids) == 2 and not any(gone(p) for p in pids)
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        wait_gone(pids, 10)
    finally:
        ctl.kill()


def test_handles_go_peer_to_peer_not_through_the_controller():
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        target = procs.slice(procs=1).spawn("p2p_target", Counter)
        relay = procs.slice(procs=0).spawn("p2p_relay", Relay)
        client = get_client()
        sent0, recv0 = client.bytes_sent, client.bytes_received
        nbytes = 16 * 1024 * 1024
        total = relay.forward_sum.call_one(target, nbytes).get(timeout=30)
        assert total == nbytes // 8  # 16 MiB went relay -> target -> relay and was summed there
        moved = (client.bytes_sent - sent0) + (client.bytes_received - recv0)
        assert moved < 64 * 1024, f"the controller carried {moved} bytes of a peer-to-peer exchange"


def test_peer_without_the_secret_never_reaches_pickle(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = procs.spawn("guarded", Counter)
        addr = Controller.current().procs[procs.proc_ids[0]].addr
        ctx = zmq.Context.instance()
        for target in (addr, Controller.current().addr):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(target.partition("#")[0])  # the zmq endpoint, without the channel nonce
            payload = pickle.dumps(Evil())
            s.send_multipart([b"\0" * 32, payload, payload])  # a forged MAC
            s.send_multipart([payload])  # no MAC at all
            time.sleep(0.3)
            s.close()
        assert not marker.exists(), "an unauthenticated message was unpickled"
        assert c.incr.call_one().get(timeout=10) == 1  # and the proc still serves its real callers


def test_stop_is_idempotent_and_calls_after_stop_fail():
    procs = rm.this_host().spawn_procs(per_host={"procs": 1})
    c = procs.spawn("stopped", Counter)
    procs.stop()
    procs.stop()
    with pytest.raises(rm.ActorDied, match="stopped"):
        c.value.call_one().get(timeout=5)


def test_a_failed_launch_leaves_nothing_and_frees_its_name(tmp_path):
    """Procs that exit at once, or never join: the launch fails, siblings stop, the name can be reused."""
    with pytest.raises(rm.ActorDied, match=r"ended before it joined \(exit code 1\)"):
        rm.this_host(python="/bin/false").spawn_procs(per_host={"procs": 2}, name="flaky")
    stuck = tmp_path / "stuck.sh"
    stuck.write_text("#!/bin/sh\nexec sleep 60\n")
    stuck.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(rm.ActorError, match="did not join within 1.0s"):
        rm.this_host(python=str(stuck)).spawn_procs(per_host={"procs": 2}, name="flaky", timeout=1.0)
    assert time.monotonic() - t0 < 8
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(stuck) in " ".join(p.info["cmdline"] or [])]
    procs = rm.this_host().spawn_procs(per_host={"procs": 1}, name="flaky")
    try:
        assert procs.spawn("again", Counter).incr.call_one().get(timeout=10) == 1
    finally:
        procs.stop()
    # the actor mesh name is free again once its procs stopped
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as more:
        assert more.spawn("again", Counter).incr.call_one().get(timeout=10) == 1
