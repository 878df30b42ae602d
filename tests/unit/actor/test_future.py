"""rlmesh's own Future (not ``concurrent.futures`` underneath): completion from any thread, first
completion wins, callbacks, waiting without a driver, and ``await`` from an event loop."""

import asyncio
import logging
import threading

import pytest

from rlmesh.actor.future import Future, flush_wakes, hold_wakes, release_wakes


def test_the_first_completion_wins_and_later_ones_are_ignored():
    f: Future = Future()
    f._set_exception(KeyError("died"))  # e.g. the proc's death, then its late reply
    f._set_result(1)
    assert f.done()
    with pytest.raises(KeyError):
        f.get(timeout=0)
    assert isinstance(f.exception(), KeyError)
    g: Future = Future()
    g._set_result(2)
    g._set_exception(KeyError("late"))
    assert g.get() == 2 and g.exception() is None


def test_callbacks_run_once_in_order_and_one_that_raises_does_not_stop_the_others(caplog):
    f: Future = Future()
    seen: list[str] = []
    f.add_done_callback(lambda fut: seen.append(f"a{fut.get()}"))
    f.add_done_callback(lambda fut: 1 / 0)
    f.add_done_callback(lambda fut: seen.append(f"c{fut.get()}"))
    with caplog.at_level(logging.ERROR, logger="rlmesh.actor.future"):
        f._set_result(5)
    f._set_result(6)
    assert seen == ["a5", "c5"]
    assert "done callback" in caplog.text and "ZeroDivisionError" in caplog.text
    f.add_done_callback(lambda fut: seen.append("late"))  # done already: runs here and now
    assert seen == ["a5", "c5", "late"]


def test_a_thread_without_a_driver_waits_and_is_woken_by_another_thread():
    f: Future = Future()
    with pytest.raises(TimeoutError, match="still pending"):
        f.exception(timeout=0.01)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(f.get(timeout=30)))
    waiter.start()
    f._set_result("x")
    waiter.join(30)
    assert got == ["x"]


def test_await_completed_from_another_thread_and_a_cancelled_await_leaves_the_future_pending():
    async def main() -> tuple:
        f: Future = Future()
        threading.Timer(0.01, f._set_result, args=(3,)).start()
        first = await f
        g: Future = Future()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(g, 0.01)  # cancels the await, not the call
        assert not g.done()
        g._set_result(4)
        h: Future = Future()
        h._set_exception(ValueError("remote"))
        with pytest.raises(ValueError):
            await h
        return first, await g

    assert asyncio.run(main()) == (3, 4)


def _counting_loop() -> tuple[asyncio.AbstractEventLoop, list[int]]:
    loop = asyncio.new_event_loop()
    calls: list[int] = []
    plain = loop.call_soon_threadsafe

    def counted(*args, **kwargs):
        calls.append(1)
        return plain(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    return loop, calls


def test_awaits_completed_in_one_drain_wake_their_loop_once_in_completion_order():
    loop, wakes = _counting_loop()
    futs: list[Future] = [Future() for _ in range(10)]
    order: list[int] = []

    async def wait(i: int) -> int:
        value = await futs[i]
        order.append(i)
        return value

    tasks = [loop.create_task(wait(i)) for i in range(10)]
    loop.run_until_complete(asyncio.sleep(0))  # every task waits on its future
    outer = hold_wakes()  # what Client._drain does around the replies it reads
    for i in reversed(range(10)):
        futs[i]._set_result(i * i)
    assert wakes == []  # held until the drain ends
    release_wakes(outer)
    assert loop.run_until_complete(asyncio.gather(*tasks)) == [i * i for i in range(10)]
    assert len(wakes) == 1 and order == list(reversed(range(10)))
    loop.close()


def test_a_thread_about_to_block_hands_over_the_wakes_it_holds():
    loop, wakes = _counting_loop()
    f: Future = Future()
    task = loop.create_task(_await(f))
    loop.run_until_complete(asyncio.sleep(0))
    outer = hold_wakes()
    f._set_result("x")
    flush_wakes()  # Client.drive_until and Future._wait do this before they block
    assert len(wakes) == 1
    assert loop.run_until_complete(task) == "x"
    release_wakes(outer)
    assert len(wakes) == 1  # nothing held twice
    loop.close()


async def _await(f: Future):
    return await f
