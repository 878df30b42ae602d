"""A stopping proc's KV gets: a key that is there is still read, a missing one is not waited for."""

import json
import time

import pytest

import rlmesh as rm
from runtime_actors import KVAtStop

pytestmark = pytest.mark.timeout(120)


def test_on_stop_reads_a_present_key_and_does_not_wait_for_a_missing_one(tmp_path):
    out = tmp_path / "at_stop.json"
    procs = rm.this_host().spawn_procs(per_host={"procs": 1})
    assert procs.spawn("kvatstop", KVAtStop, str(out)).ready.call_one().get(timeout=30)
    rm.actor.kv.put("atstop/there", {"v": 7})
    t0 = time.monotonic()
    procs.stop(timeout=30)
    assert time.monotonic() - t0 < 20  # a hang bound: waiting for the missing key would take 30 s
    seen = json.loads(out.read_text())
    assert seen["there"] == {"v": 7}  # answered: the key was there
    assert "not present" in seen["missing"] and seen["waited_s"] < 10  # refused at once, not after 30 s


def test_a_call_to_a_proc_that_stops_first_fails_when_both_are_stopped(tmp_path):
    """Two procs stopped together (a recipe's end): one is blocked in a call to the other. The callee
    exits first, and the caller's call must fail then, not hold the caller's stop until the
    deadline kills it (5 s of every run's teardown, found in `ppo_cartpole`)."""
    from runtime_actors import Blocker, CallsBlocker

    out = tmp_path / "how.txt"
    procs = rm.this_host().spawn_procs(per_host={"procs": 2})
    blocker = procs.slice(procs=1).spawn("blocker", Blocker)
    caller = procs.slice(procs=0).spawn("caller", CallsBlocker, blocker, str(out))
    pending = caller.call_it.call_one()
    assert rm.actor.kv.get("blocker/holding", timeout=60) is True  # the call reached the callee, which holds it
    t0 = time.monotonic()
    procs.stop(timeout=30)
    took = time.monotonic() - t0
    how = out.read_text()
    assert how.startswith("ActorDied: blocker[0].hold: the proc hosting this actor died") and "stopped" in how, how
    assert took < 20, f"the caller's stop waited {took:.1f} s for a call to a proc that had stopped"
    try:  # the controller's own call to the caller ends too: its reply, or its proc's stop if that came first
        assert pending.get(timeout=10) == how
    except rm.ActorDied as exc:  # the reply and the exit travel on different sockets: either may arrive first
        assert "stopped" in str(exc), exc
