"""An async endpoint whose coroutine is closed with its proc's event loop (the proc stopping while
the call is pending), or cancelled by the proc's stop, sends no reply: its caller learns of the stop
from the proc's end (ActorDied), not from a racing ``ActorError: GeneratorExit`` or
``CancelledError``. Pure logic: the server's reply path is recorded."""

import asyncio

from rlmesh.actor.server import ActorServer, _Served


class _Recorded(ActorServer):
    def __init__(self, stopping: bool = False) -> None:  # no sockets: only the serving coroutine is exercised
        self.finished: list[BaseException | None] = []
        self._stopping = stopping
        self._serving: set[asyncio.Task] = set()

    def _finish(self, call, hosted, result=None, exc=None, tb=None) -> None:
        self.finished.append(exc)


def _served() -> _Served:
    return _Served(1, "inbox", "blocker/0", "hold", "caller", 0.0, 0)


def test_a_coroutine_closed_with_the_loop_sends_no_reply():
    server = _Recorded()

    async def hold() -> None:
        await asyncio.Event().wait()

    loop = asyncio.new_event_loop()
    coro = server._serve_async(_served(), None, hold, (), {})
    task = loop.create_task(coro)
    loop.run_until_complete(asyncio.sleep(0))  # the endpoint is now waiting
    assert not task.done()
    coro.close()  # what the loop's teardown does to a task still pending: GeneratorExit inside it
    task._log_destroy_pending = False  # left pending on purpose: no "Task was destroyed" noise in the output
    loop.close()
    assert server.finished == []


def test_an_endpoint_that_raises_still_replies_with_its_error():
    server = _Recorded()

    async def boom() -> None:
        raise ValueError("bad input")

    asyncio.run(server._serve_async(_served(), None, boom, (), {}))
    assert len(server.finished) == 1 and isinstance(server.finished[0], ValueError)


def _cancelled_while_pending(server: _Recorded) -> None:
    async def hold() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        call = _served()
        task = call.task = asyncio.get_running_loop().create_task(server._serve_async(call, None, hold, (), {}))
        server._serving.add(task)  # as _dispatch does
        await asyncio.sleep(0)  # the endpoint is now waiting
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not server._serving  # the call took itself out of the in-flight set

    asyncio.run(main())


def test_a_call_cancelled_by_the_procs_stop_sends_no_reply():
    server = _Recorded(stopping=True)
    _cancelled_while_pending(server)
    assert server.finished == []


def test_a_call_cancelled_otherwise_still_replies_with_the_cancellation():
    server = _Recorded(stopping=False)
    _cancelled_while_pending(server)
    assert len(server.finished) == 1 and isinstance(server.finished[0], asyncio.CancelledError)


def test_a_finished_call_leaves_the_in_flight_set():
    """What ``cancel_calls`` cancels at stop: only calls still running (each takes itself out)."""
    server = _Recorded()

    async def ok() -> int:
        return 1

    async def boom() -> None:
        raise ValueError("bad input")

    async def main() -> None:
        for fn in (ok, boom):
            call = _served()
            task = call.task = asyncio.get_running_loop().create_task(server._serve_async(call, None, fn, (), {}))
            server._serving.add(task)  # as _dispatch does
            await task
            assert not server._serving

    asyncio.run(main())
    assert server.finished[0] is None and isinstance(server.finished[1], ValueError)
