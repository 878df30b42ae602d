"""A restarted trainer's sample is not starved by its dead incarnation's call, still waiting in the buffer.

The buffer keeps serving a ``sample`` call whose caller died (a trainer SIGKILLed while it waited
for rollouts). That call used to take the next batch onto a lease nobody would train, and the
replacement waited a whole generation round for the batch after it (4.5-6.5 s in 2 of 11 trainer
kills). The real actor class on a real event loop; no procs (the logic is the buffer's alone).
"""

import asyncio

from rlmesh.rl.actors.replay_buffer import ReplayBuffer


async def _yield_until(cond, rounds: int = 100) -> None:
    for _ in range(rounds):  # event-loop turns, not time: the other task runs to its first wait
        if cond():
            return
        await asyncio.sleep(0)


def test_a_newer_trainer_sample_supersedes_a_waiting_one():
    async def scenario():
        buf = ReplayBuffer()
        dead = asyncio.ensure_future(buf.sample(1, 0, 30.0, 0, 0))  # the killed trainer's call
        await _yield_until(lambda: buf._event is not None)
        live = asyncio.ensure_future(buf.sample(1, 0, 30.0, 0, 0))  # its replacement's, after loading cursor 0
        assert await buf.add("r1", 0, {"x": 1}) == ""
        got = await asyncio.wait_for(live, 5)  # the old call, first in line, used to take r1
        assert [r.rollout_id for r in got.rollouts] == ["r1"] and got.lease is not None
        old = await asyncio.wait_for(dead, 5)  # superseded: returned empty
        assert old.rollouts == [] and old.lease is None
        assert await buf.holding() == ["r1"]  # on the live lease, nowhere else

    asyncio.run(scenario())


def test_unleased_samples_do_not_supersede_each_other():
    async def scenario():
        buf = ReplayBuffer()
        first = asyncio.ensure_future(buf.sample(1, 0, 30.0))
        await _yield_until(lambda: buf._event is not None)
        second = asyncio.ensure_future(buf.sample(1, 0, 30.0))
        await buf.add("r1", 0, {"x": 1})
        await buf.add("r2", 0, {"x": 2})
        got = await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert sorted(r.rollout_id for g in got for r in g.rollouts) == ["r1", "r2"]

    asyncio.run(scenario())
