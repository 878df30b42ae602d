"""An async endpoint whose coroutine is closed with its proc's event loop (the proc stopping while
the call is pending) sends no reply: its caller learns of the stop from the proc's end (ActorDied),
not from a racing ``ActorError: GeneratorExit``. Pure logic: the server's reply path is recorded."""

import asyncio

from rlmesh.actor.server import ActorServer, _Served


class _Recorded(ActorServer):
    def __init__(self) -> None:  # no sockets: only the serving coroutine is exercised
        self.finished: list[BaseException | None] = []

    def _finish(self, call, hosted, frames=None, exc=None, tb=None) -> None:
        self.finished.append(exc)

    def _reply_result(self, call, hosted, result) -> None:
        self.finished.append(None)


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
    loop.close()
    assert server.finished == []


def test_an_endpoint_that_raises_still_replies_with_its_error():
    server = _Recorded()

    async def boom() -> None:
        raise ValueError("bad input")

    asyncio.run(server._serve_async(_served(), None, boom, (), {}))
    assert len(server.finished) == 1 and isinstance(server.finished[0], ValueError)
