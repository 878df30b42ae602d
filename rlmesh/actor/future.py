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
import itertools
import logging
import threading
from asyncio import _get_running_loop
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
        # None, one callback, or a list of them: most futures get exactly one (a gather's, an await's), and a
        # list per future was one more object per call for the garbage collector to walk (issue 40).
        self._callbacks: Callable[["Future[T]"], None] | list[Callable[["Future[T]"], None]] | None = None
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
        if type(callbacks) is list:
            for fn in callbacks:
                _run_callback(fn, self)
        elif callbacks is not None:
            _run_callback(callbacks, self)  # type: ignore[arg-type]  # one callback, not a list

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
        if not self._done and self._driver is not None:
            self._driver.send_held()  # polled in a loop that blocks this turn: its calls must leave first
            self._driver.read_if_reading_here()  # ... and its replies be read, if that loop is their reader
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
            cbs = self._callbacks
            if cbs is None:
                self._callbacks = fn
            elif type(cbs) is list:
                cbs.append(fn)
            else:
                self._callbacks = [cbs, fn]  # type: ignore[list-item]  # cbs is one callback here
            return True

    def _wait(self, timeout: float | None) -> None:
        flush_wakes()  # a done callback that blocks: the awaits completed before it are not held meanwhile
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
            wake = _Wake(loop, waiter)
            # The client's inbox is read on this loop while it awaits (Client.await_begins): no other thread
            # wakes to read the reply, nor to wake this one.
            reader = None if self._driver is None else self._driver.await_begins(loop)
            try:
                if reader is None:
                    self.add_done_callback(wake)
                elif not self._add_callback(wake):
                    return self.get()  # done meanwhile
                yield from waiter.__await__()  # cancelling the await leaves this future as it is
            finally:
                if reader is not None:
                    reader.ended()
        return self.get()

    def __repr__(self) -> str:
        return f"<rlmesh.Future {'done' if self._done else 'pending'}>"


class _Wake:
    """An await's done callback: resolves the awaiting loop's waiter, from whichever thread completed the
    future. An object rather than a closure: one object per await for the garbage collector, not three."""

    __slots__ = ("loop", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]):
        self.loop = loop
        self.waiter = waiter

    def __call__(self, _f: Future[Any]) -> None:  # on the completing thread
        loop, waiter = self.loop, self.waiter
        if _get_running_loop() is loop:  # the loop's own thread read the reply: no wake-up to send
            if not waiter.done():  # the awaiting task may have been cancelled meanwhile
                waiter.set_result(None)
            return
        held = getattr(_held, "wakes", None)
        if held is None:
            _wake_now(loop, [waiter])
        else:  # the completing thread is draining replies: one wake-up per loop per drain
            waiters = held.setdefault(loop, [])
            waiters.append(waiter)
            if len(waiters) >= _HOLD_MAX:
                del held[loop]
                _wake_now(loop, waiters)


def _still_pending(timeout: float | None) -> TimeoutError:
    """What a wait that gave up raises: the call itself goes on (``get`` again, or ``await``, later)."""
    return TimeoutError(f"no result within {timeout}s (the call is still pending)")


def _resolve(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():  # the awaiting task may have been cancelled meanwhile
            waiter.set_result(None)


# Wake-ups of awaiting event loops, held by a thread while it drains replies (Client._drain): the
# awaits a drain completes on one loop are resolved by one call_soon_threadsafe, in completion
# order, when the drain ends, instead of one each. Why: each costs a write to the loop's self-pipe
# and a loop wake-up, and a burst of pipelined replies is drained in one go (issue 40).
_held = threading.local()
_Held = dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]]
_HOLD_MAX = 64  # a long drain hands a loop its wake-ups in batches of this many, not all at its end


def _wake_now(loop: asyncio.AbstractEventLoop, waiters: list[asyncio.Future[None]]) -> None:
    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(_resolve, waiters)
        except RuntimeError:  # closed meanwhile: nothing awaits on it any more
            pass


def hold_wakes() -> _Held | None:
    """Hold this thread's wake-ups of awaiting loops until :func:`release_wakes`; returns what to pass
    it. A hold inside a hold (a done callback that waits and drains) first hands over what the outer
    one held, so nothing waits on a thread that may block."""
    outer = getattr(_held, "wakes", None)
    if outer:
        flush_wakes()
    _held.wakes = {}
    return outer


def release_wakes(outer: _Held | None) -> None:
    """End a :func:`hold_wakes`: wake each loop once for the awaits completed meanwhile."""
    held = _held.wakes
    _held.wakes = outer
    for loop, waiters in held.items():
        _wake_now(loop, waiters)


def flush_wakes() -> None:
    """Hand over the wake-ups this thread holds now (before it blocks), and keep holding."""
    held = getattr(_held, "wakes", None)
    if held:
        items = list(held.items())
        held.clear()
        for loop, waiters in items:
            _wake_now(loop, waiters)


def _run_callback(fn: Callable[[Any], None], fut: Future[Any]) -> None:
    try:
        fn(fut)
    except Exception:
        logger.exception("a done callback of %r failed", fut)


def gather_futures(futs: list[Future[Any]], combine: Callable[[list[Any]], T]) -> Future[T]:
    """A future that completes with ``combine(results)`` once all complete, or fails with the first error."""
    out: Future[T] = Future(driver=next((f._driver for f in futs if f._driver is not None), None))
    if not futs:
        out._set_result(combine([]))
        return out
    g = _Gather(futs, combine, out)
    cb = g.one_done  # one bound method for all of them
    for f in futs:
        if not f._add_callback(cb):  # done already: here and now
            _run_callback(cb, f)
    return out


class _Gather:
    """What :func:`gather_futures` waits on: one object and one callback for all its futures, the results read
    from them at the end, rather than a closure, a results list and a lock each (one call of a 4-actor mesh
    made ten objects for the garbage collector; issue 40). The count goes down by ``next`` on an
    ``itertools.count``: one step under the GIL, so completions on several threads never lose one."""

    __slots__ = ("futs", "combine", "out", "counted", "last")

    def __init__(self, futs: list[Future[Any]], combine: Callable[[list[Any]], Any], out: Future[Any]):
        self.futs = futs
        self.combine = combine
        self.out = out
        self.counted = itertools.count(1)
        self.last = len(futs)

    def one_done(self, f: Future[Any]) -> None:
        if f._exc is not None:
            self.out._set_exception(f._exc)
        elif next(self.counted) == self.last:
            self.out._set_result(self.combine([x._value for x in self.futs]))
