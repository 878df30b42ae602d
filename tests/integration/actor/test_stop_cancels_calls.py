"""A stopping proc cancels the async calls it still runs: their cleanup runs, and their callers get ``ActorDied``.

Before, such a call was dropped with the proc: its ``except``/``finally`` never ran, and when the
garbage collector met its task before the exit, asyncio logged "Task was destroyed but it is
pending!" into the proc's logs (seen in a suite run). The cancelled call sends no reply, so its
caller still learns of the stop from the proc's end, as for any unanswered call.
"""

import time

import pytest

import rlmesh as rm
from runtime_actors import CleansUp

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("hang_in_cleanup", [False, True], ids=["cleanup", "cleanup-that-hangs"])
def test_a_call_in_flight_at_stop_is_cancelled_and_its_caller_gets_actor_died(tmp_path, hang_in_cleanup):
    out = tmp_path / "cleanup.txt"
    procs = rm.this_host().spawn_procs(per_host={"procs": 1})
    key = f"cleansup/{tmp_path.name}/holding"
    pending = procs.spawn("cleansup", CleansUp, str(out)).hold.call_one(key, hang_in_cleanup)
    assert rm.actor.kv.get(key, timeout=60) is True  # the call is running
    t0 = time.monotonic()
    procs.stop(timeout=30)
    assert time.monotonic() - t0 < 25  # a hang bound: a cleanup that hangs is abandoned after a grace
    assert out.read_text() == "cancelled\n"  # its cleanup ran, once
    with pytest.raises(rm.ActorDied, match="stopped"):  # no reply: the caller learns of the stop
        pending.get(timeout=30)
