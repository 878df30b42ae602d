"""One future type for sync and async code: ``await fut`` or ``fut.get(timeout)``.

Why: the same controller program should read the same whether it is an asyncio
program, a plain script or a Jupyter cell. The future is completed by whichever
thread reads the reply (a thread blocked in ``get()`` reads the inbox itself, see
``Client.drive_until``); ``await`` bridges to the running event loop, ``get``
blocks the calling thread.

Why not ``concurrent.futures.Future`` underneath (it was, until Dec 2026): every call makes
one, and that type builds a ``Condition`` (an ``RLock`` and a waiter list) per future and
takes it on each ``done()``, five or six times per blocking call. Here the state is three
slots set once under one module-wide lock, ``done()`` is an attribute read, and a thread
that waits without a driver gets an ``Event`` made only then: a third of the cost to make,
complete and read (measured in docs/performance.md).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable, Generator, Generic, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)

_lock = threading.Lock()  # guards every future's completion and callback list (held for a few bytecodes)


class Future(Generic[T]):
    __slots__ = ("_done", "_value", "_exc", "_callbacks", "_event", "_driver")

    def __init__(self, driver: Any = None):
        self._done = False
        self._value: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[["Future[T]"], None]] | None = None
        self._event: threading.Event | None = None
        # The client whose inbox delivers this result: get() reads it directly instead of
        # waiting to be woken by the IO thread (see Client.drive_until).
        self._driver = driver

    # --- producer side (runtime) ---
    def _set_result(self, value: Any) -> None:
        self._complete(value, None)

    def _set_exception(self, exc: BaseException) -> None:
        self._complete(None, exc)

    def _complete(self, value: Any, exc: BaseException | None) -> None:
        """First completion wins (a reply racing a death or a timeout); later ones are ignored."""
        with _lock:
            if self._done:
                return
            self._value, self._exc = value, exc
            self._done = True  # last: a reader that sees it done sees the outcome
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        for fn in callbacks or ():
            _run_callback(fn, self)

    # --- consumer side ---
    def get(self, timeout: float | None = None) -> T:
        """Block until done and return the value (or raise the remote error). ``TimeoutError`` after ``timeout`` s."""
        if not self._done:
            if self._driver is not None:
                try:
                    self._driver.drive_until(self, timeout)
                except TimeoutError:
                    raise _still_pending(timeout) from None
            if not self._done:  # no driver, or its client closed (it fails every pending future next)
                self._wait(timeout)
        if self._exc is not None:
            raise self._exc
        return self._value  # type: ignore[no-any-return]  # Any until done (a slot); then the call's T

    def result(self, timeout: float | None = None) -> T:
        return self.get(timeout)

    def done(self) -> bool:
        return self._done

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's error once done (``None`` if it succeeded); waits up to ``timeout`` s like :meth:`get`."""
        try:
            self.get(timeout)
        except BaseException as exc:  # noqa: BLE001 - the call's own error is the answer
            if exc is self._exc:
                return exc
            raise
        return None

    def add_done_callback(self, fn: Callable[["Future[T]"], None]) -> None:
        """Call ``fn(self)`` once done: on the completing thread, or here and now if done already."""
        if self._add_callback(fn):
            if self._driver is not None:  # a consumer that does not read replies itself: someone must
                self._driver.wake_reader()
        else:
            _run_callback(fn, self)

    def _add_callback(self, fn: Callable[["Future[T]"], None]) -> bool:
        """Register ``fn`` if not done yet (``True``), without waking the client's IO thread: for a thread
        that reads the replies itself (``Client.drive_until``) and for :func:`gather_futures`, whose
        combined future wakes it when it gets a consumer of its own."""
        with _lock:
            if self._done:
                return False
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append(fn)
            return True

    def _wait(self, timeout: float | None) -> None:
        with _lock:
            if self._done:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):
            raise _still_pending(timeout)

    def __await__(self) -> Generator[Any, None, T]:
        if not self._done:
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()

            def wake(_f: "Future[T]") -> None:  # on the completing thread
                if not loop.is_closed():
                    loop.call_soon_threadsafe(_resolve, waiter)

            self.add_done_callback(wake)
            yield from waiter.__await__()  # cancelling the await leaves this future as it is
        return self.get()

    def __repr__(self) -> str:
        return f"<rlmesh.Future {'done' if self._done else 'pending'}>"


def _still_pending(timeout: float | None) -> TimeoutError:
    """What a wait that gave up raises: the call itself goes on (``get`` again, or ``await``, later)."""
    return TimeoutError(f"no result within {timeout}s (the call is still pending)")


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # the awaiting task may have been cancelled meanwhile
        waiter.set_result(None)


def _run_callback(fn: Callable[[Any], None], fut: Future[Any]) -> None:
    try:
        fn(fut)
    except Exception:
        logger.exception("a done callback of %r failed", fut)


def gather_futures(futs: list[Future[Any]], combine: Callable[[list[Any]], T]) -> Future[T]:
    """A future that completes with ``combine(results)`` once all complete, or fails with the first error."""
    out: Future[T] = Future(driver=next((f._driver for f in futs if f._driver is not None), None))
    n = len(futs)
    results: list[Any] = [None] * n
    remaining = [n]
    lock = threading.Lock()
    if n == 0:
        out._set_result(combine([]))
        return out

    def on_done(i: int, f: Future[Any]) -> None:
        if f._exc is not None:
            out._set_exception(f._exc)
            return
        results[i] = f._value
        with lock:  # completions may arrive on the IO thread and the supervisor thread
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            out._set_result(combine(results))

    for i, f in enumerate(futs):
        cb = lambda f, i=i: on_done(i, f)  # noqa: E731
        if not f._add_callback(cb):  # done already: here and now
            _run_callback(cb, f)
    return out
