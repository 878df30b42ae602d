"""Replies made in one turn of a worker's loop travel as one message (issue 40), and batching never
holds a reply for a call that is still running, nor mixes up whose reply is whose."""

import asyncio
import threading
import time

import pytest

import rlmesh as rm
from rlmesh.actor.client import get_client

pytestmark = pytest.mark.timeout(60)


class Gated(rm.Actor):
    def __init__(self):
        self.gate = asyncio.Event()

    @rm.endpoint
    async def after_gate(self, i: int) -> int:
        await self.gate.wait()
        if i == 7:
            raise KeyError(f"seven {i}")
        return i * 10

    @rm.endpoint
    async def open(self) -> str:
        self.gate.set()
        return "open"

    @rm.endpoint
    async def never(self) -> None:
        await asyncio.Event().wait()

    @rm.endpoint
    async def ping(self, x):
        return x


@pytest.fixture(scope="module")
def gated():
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        yield procs.spawn("gated", Gated)


def test_replies_finished_in_one_turn_come_in_one_message_each_to_its_own_call(gated):
    client = get_client()
    waiting = [gated.after_gate.call_one(i) for i in range(50)]
    assert gated.ping.call_one("warm").get(timeout=10) == "warm"  # every after_gate call has reached the actor
    before = client.reply_messages
    opened = gated.open.call_one()
    assert opened.get(timeout=10) == "open"
    for i, fut in enumerate(waiting):
        if i == 7:
            with pytest.raises(rm.ActorError) as err:
                fut.get(timeout=10)
            assert "KeyError" in str(err.value) and "seven 7" in err.value.remote_traceback
        else:
            assert fut.get(timeout=10) == i * 10
    # 51 replies (50 woken calls and open) finished in one or two turns of the loop: a message per
    # turn, not per reply (51 without batching).
    assert client.reply_messages - before <= 4


def test_a_call_that_keeps_running_does_not_hold_back_other_replies(gated):
    stuck = gated.never.call_one()
    for i in range(20):
        assert gated.ping.call_one(i).get(timeout=5) == i
    assert not stuck.done()


def test_pipelined_calls_from_an_event_loop_each_get_their_own_reply(gated):
    async def burst():
        return await asyncio.gather(*[gated.ping.call_one(i) for i in range(500)])

    assert asyncio.run(burst()) == list(range(500))


class Log(rm.Actor):
    def __init__(self):
        self.seen = []

    @rm.endpoint
    async def add(self, x):
        self.seen.append(x if isinstance(x, int) else len(x))
        return len(self.seen)

    @rm.endpoint
    async def take(self) -> list:
        seen, self.seen = self.seen, []
        return seen


@pytest.fixture(scope="module")
def log():
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        yield procs.spawn("log", Log)


def test_calls_made_in_one_turn_of_a_loop_go_as_one_message_in_order(log):
    client = get_client()

    async def burst():
        before = client.call_messages
        futs = [log.add.call_one(i) for i in range(300)]
        futs.append(log.add.call_one(b"x" * 100_000))  # too large to hold: what was held goes first
        futs += [log.add.call_one(i) for i in range(301, 310)]
        log.add.broadcast(310)  # nothing waits on a broadcast: it goes at once, after what was held
        futs += [log.add.call_one(i) for i in range(311, 320)]
        sent = client.call_messages - before
        counts = await asyncio.gather(*futs)
        return sent, client.call_messages - before, counts

    sent, total, counts = asyncio.run(burst())
    # The 300 held calls go as one message when the large call is sent, then it; the next 9 when the
    # broadcast is sent, then it; the last 9 as one more at the end of the turn: 5 messages for 320 calls.
    assert (sent, total) == (4, 5)
    assert counts == [*range(1, 302), *range(302, 311), *range(312, 321)]
    assert log.take.call_one().get(timeout=10) == [*range(300), 100_000, *range(301, 320)]


def test_a_blocking_get_in_a_coroutine_sends_what_its_turn_held(log):
    async def blocks():
        held = log.add.call_one(1)
        return held.get(timeout=10)  # blocks this loop: without sending first, its turn never ends

    assert asyncio.run(blocks()) == 1
    assert log.take.call_one().get(timeout=10) == [1]


def test_polling_done_in_a_coroutine_sends_what_its_turn_held(log):
    async def polls():
        held = log.add.call_one(2)
        deadline = time.monotonic() + 10
        while not held.done():  # blocks this loop's turn: without sending first, the call never leaves
            assert time.monotonic() < deadline, "a polled call was never sent"
            time.sleep(0.001)
        return held.get()

    assert asyncio.run(polls()) == 1
    assert log.take.call_one().get(timeout=10) == [2]


def test_a_plain_for_over_a_stream_in_a_coroutine_sends_what_its_turn_held(log):
    async def streams():
        return list(log.add.stream(5))

    assert asyncio.run(streams()) == [1]
    assert log.take.call_one().get(timeout=10) == [5]


def test_a_loop_that_awaits_reads_its_own_replies(log):
    """While coroutines await, their loop reads the inbox itself: no other thread completes their futures
    (nor wakes the loop for them)."""
    completed_on = set()

    async def burst():
        futs = [log.add.call_one(i) for i in range(200)]
        for f in futs:
            f.add_done_callback(lambda f: completed_on.add(threading.get_ident()))
        await asyncio.gather(*futs)
        return threading.get_ident()

    loop_thread = asyncio.run(burst())
    log.take.call_one().get(timeout=10)  # before asserting: the next test counts from an empty log
    assert completed_on == {loop_thread}


def test_a_loop_stopped_with_an_await_pending_leaves_the_inbox_to_others(gated):
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(_await(gated.never.call_one()))
        loop.run_until_complete(asyncio.sleep(0.05))  # the loop watches the inbox for that await, then stops
        done = threading.Event()
        gated.ping.call_one(1).add_done_callback(lambda f: done.set())
        assert done.wait(10), "a reply was left to a loop that no longer runs"
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        loop.close()


async def _await(fut):
    return await fut


class Relay(rm.Actor):
    @rm.endpoint
    async def burst(self, target, n: int) -> list:
        """Pipelined calls from an actor's own loop (uvloop in workers): held for its turn, replies read on it."""
        return await asyncio.gather(*[target.add.call_one(i) for i in range(n)])


def test_an_actors_loop_batches_its_calls_and_reads_their_replies(log):
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        relay = procs.spawn("relay", Relay)
        assert relay.burst.call_one(log, 100).get(timeout=30) == list(range(1, 101))
        assert relay.burst.call_one(log, 3).get(timeout=30) == [101, 102, 103]
    assert log.take.call_one().get(timeout=10) == [*range(100), 0, 1, 2]
