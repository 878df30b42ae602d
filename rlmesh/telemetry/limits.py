"""Every telemetry query has a time limit and can be stopped from another thread.

Why: one expensive ``SELECT`` (a cross join, an aggregate over a huge table) would otherwise run
for hours, holding a core and, on a live run, the service's attention. Each query runs under a
:class:`Guard`: a deadline (the call's ``timeout``, else ``RLMESH_QUERY_TIMEOUT_S``) watched by
one daemon thread per process, and an ``interrupt`` function (DuckDB's own ``con.interrupt()``
for a local query; for a query sent to a live service, the wait ends and the service is told to
interrupt it). A guard also fires when its :class:`Scope` is cancelled (the dashboard's client
went away, a live query's client said so) or on :func:`cancel_all` (a dashboard or service stopping).

The module has no heavy imports: a worker that never queries pays nothing for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import os
import threading
import time
from typing import Callable, Iterator

from rlmesh import settings
from rlmesh.telemetry.errors import TelemetryError

logger = logging.getLogger(__name__)

TIMEOUT = "timeout"


class QueryTimeoutError(TelemetryError, TimeoutError):
    """A query ran past its time limit and DuckDB stopped it; the message names the limit and the setting."""


class QueryCancelledError(TelemetryError):
    """A query was stopped before its limit (its client went away, the service or dashboard is stopping)."""


def limit_for(timeout: float | None) -> float:
    """The limit of one call: ``timeout`` if given, else ``RLMESH_QUERY_TIMEOUT_S``."""
    if timeout is None:
        return settings.QUERY_TIMEOUT_S.get()
    limit = float(timeout)
    if not limit > 0:
        raise ValueError(f"timeout={timeout!r}: a query's time limit must be a number of seconds > 0")
    return limit


def timeout_message(limit: float) -> str:
    return (f"telemetry query stopped at its time limit of {limit:g} s; narrow it (a WHERE on ts, a LIMIT, no cross "
            f"join) or give it longer: timeout= (rm.telemetry.query), --timeout (rlmesh sql), timeout_s (MCP query, "
            f"the dashboard's SQL page) or {settings.QUERY_TIMEOUT_S.name} (default "
            f"{settings.QUERY_TIMEOUT_S.default:g} s)")


class Guard:
    """One query in flight: ``interrupt`` is called once, at the deadline or when cancelled."""

    def __init__(self, limit: float, interrupt: Callable[[], None] | None = None):
        self.limit = limit
        self.deadline = time.monotonic() + limit
        self.fired: str | None = None  # TIMEOUT, or why it was cancelled
        self._interrupt = interrupt
        self._lock = threading.Lock()

    def fire(self, reason: str) -> None:
        with self._lock:
            if self.fired is not None:
                return
            self.fired = reason
        if self._interrupt is not None:
            try:
                self._interrupt()
            except Exception:  # noqa: BLE001 - a query that just ended has nothing left to interrupt
                logger.debug("telemetry: interrupting a query failed", exc_info=True)

    def error(self) -> TelemetryError:
        if self.fired == TIMEOUT:
            return QueryTimeoutError(timeout_message(self.limit))
        return QueryCancelledError(f"telemetry query cancelled: {self.fired}")

    def check(self) -> None:
        """Raise the guard's error if it fired (for waits that poll rather than get interrupted)."""
        if self.fired is None and time.monotonic() >= self.deadline:
            self.fire(TIMEOUT)
        if self.fired is not None:
            raise self.error()


class Scope:
    """Queries started inside ``with scope:`` (in this thread, or a thread run with a copy of its context)
    that :meth:`cancel` stops together, those still to start included."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._guards: set[Guard] = set()
        self._lock = threading.Lock()

    def cancel(self, reason: str) -> None:
        with self._lock:
            self.reason = self.reason or reason
            guards = list(self._guards)
        for g in guards:
            g.fire(reason)

    def _add(self, g: Guard) -> None:
        with self._lock:
            self._guards.add(g)
            reason = self.reason
        if reason is not None:
            g.fire(reason)

    def _discard(self, g: Guard) -> None:
        with self._lock:
            self._guards.discard(g)

    @contextlib.contextmanager
    def active(self) -> Iterator[Scope]:
        token = _scope.set(self)
        try:
            yield self
        finally:
            _scope.reset(token)


_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("rlmesh_query_scope", default=None)
_cv = threading.Condition()
_running: dict[int, Guard] = {}
_ids = itertools.count()
_watchdog: threading.Thread | None = None


def _after_fork_in_child() -> None:
    global _cv, _watchdog
    _cv, _watchdog = threading.Condition(), None  # the parent's watchdog thread is not in the child
    _running.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def guarded(limit: float, interrupt: Callable[[], None] | None = None) -> Iterator[Guard]:
    """Run a query under a :class:`Guard` (deadline, the current scope, :func:`cancel_all`)."""
    global _watchdog
    g = Guard(limit, interrupt)
    key = next(_ids)
    with _cv:
        _running[key] = g
        if _watchdog is None or not _watchdog.is_alive():
            _watchdog = threading.Thread(target=_watch, name="rlmesh-query-watchdog", daemon=True)
            _watchdog.start()
        _cv.notify_all()
    scope = _scope.get()
    if scope is not None:
        scope._add(g)
    try:
        yield g
    finally:
        if scope is not None:
            scope._discard(g)
        with _cv:
            _running.pop(key, None)


def _watch() -> None:
    while True:
        with _cv:
            now = time.monotonic()
            due = [g for g in _running.values() if g.fired is None and g.deadline <= now]
            if not due:
                waiting = [g.deadline for g in _running.values() if g.fired is None]
                _cv.wait(min(waiting) - now if waiting else None)
                continue
        for g in due:
            g.fire(TIMEOUT)


def cancel_all(reason: str) -> int:
    """Stop every query in flight in this process (a dashboard or service stopping); returns how many."""
    with _cv:
        guards = [g for g in _running.values() if g.fired is None]
    for g in guards:
        g.fire(reason)
    return len(guards)


def in_flight() -> int:
    with _cv:
        return len(_running)
