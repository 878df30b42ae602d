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
