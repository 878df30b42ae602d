"""One future type for sync and async code: ``await fut`` or ``fut.get(timeout)``.

Why: the same controller program should read the same whether it is an asyncio
program, a plain script or a Jupyter cell. The future is completed by the
client's IO thread; ``await`` bridges to the running event loop, ``get`` blocks
the calling thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class Future(Generic[T]):
    __slots__ = ("_cf", "_driver")

    def __init__(self, cf: concurrent.futures.Future | None = None, driver: Any = None):
        self._cf: concurrent.futures.Future = cf if cf is not None else concurrent.futures.Future()
        # The client whose inbox delivers this result: get() reads it directly instead of
        # waiting to be woken by the IO thread (see Client.drive_until).
        self._driver = driver

    # --- producer side (runtime) ---
    def _set_result(self, value: Any) -> None:
        if not self._cf.done():
            try:
                self._cf.set_result(value)
            except concurrent.futures.InvalidStateError:
                pass

    def _set_exception(self, exc: BaseException) -> None:
        if not self._cf.done():
            try:
                self._cf.set_exception(exc)
            except concurrent.futures.InvalidStateError:
                pass

    # --- consumer side ---
    def get(self, timeout: float | None = None) -> T:
        """Block until done and return the value (or raise the remote error). ``TimeoutError`` after ``timeout`` s."""
        try:
            if self._driver is not None and not self._cf.done():
                self._driver.drive_until(self._cf, timeout)
            return self._cf.result(0 if self._driver is not None and self._cf.done() else timeout)
        except concurrent.futures.TimeoutError:
            if self._cf.done():  # the call itself failed with a TimeoutError (e.g. rm.CallTimeout)
                raise
            raise TimeoutError(f"no result within {timeout}s (the call is still pending)") from None

    def result(self, timeout: float | None = None) -> T:
        return self.get(timeout)

    def done(self) -> bool:
        return self._cf.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._cf.exception(timeout)

    def add_done_callback(self, fn: Callable[["Future[T]"], None]) -> None:
        self._cf.add_done_callback(lambda _cf: fn(self))

    def __await__(self):
        return asyncio.wrap_future(self._cf).__await__()

    def __repr__(self) -> str:
        state = "done" if self._cf.done() else "pending"
        return f"<rlmesh.Future {state}>"


def gather_futures(futs: list[Future], combine: Callable[[list[Any]], T]) -> Future[T]:
    """A future that completes with ``combine(results)`` once all complete, or fails with the first error."""
    out: Future[T] = Future(driver=next((f._driver for f in futs if f._driver is not None), None))
    n = len(futs)
    results: list[Any] = [None] * n
    remaining = [n]
    lock = threading.Lock()
    if n == 0:
        out._set_result(combine([]))
        return out

    def on_done(i: int, cf: concurrent.futures.Future) -> None:
        exc = cf.exception()
        if exc is not None:
            out._set_exception(exc)
            return
        results[i] = cf.result()
        with lock:  # completions may arrive on the IO thread and the supervisor thread
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            out._set_result(combine(results))

    for i, f in enumerate(futs):
        f._cf.add_done_callback(lambda cf, i=i: on_done(i, cf))
    return out
