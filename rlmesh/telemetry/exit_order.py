"""Exit handlers that must run after the run's own: those DuckDB (and pyarrow) register when imported.

Why: once DuckDB's exit handler has run, DuckDB refuses every query that reads a Python object
(an Arrow batch) from any thread but the main one: "this query cannot run Python code: the Python
interpreter is shutting down". The run's exit handler (:func:`rlmesh.telemetry.api.finish_run`)
stops the procs and has the service's writer thread put their last rows in the file, so it must
run first. ``atexit`` runs the newest handler first, and the service imports DuckDB on its opener
thread, after the run's handler was registered: DuckDB's came out newer. Registering the run's
handler again right after the import left a window (the rest of DuckDB's import, then the
re-registration) in which a program that ended ran DuckDB's handler first, and every row of the
run was refused: ``runs`` said ``ok`` with 0 rows (seen in a full suite run, then 9 runs of 25 of
``scenario.py no_with`` beside four busy loops).

So the opener imports DuckDB and pyarrow inside :func:`handlers_deferred`: exit handlers that its
thread registers meanwhile are kept here, and the run's exit handler runs them when it is done
(:func:`run_deferred`), in ``atexit``'s order. No window is left, whichever thread gets where first.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from typing import Any, Callable, Iterator

logger = logging.getLogger(__name__)

_deferred: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
_patch_lock = threading.Lock()  # one patch of atexit.register at a time (several services in a test process)


@contextlib.contextmanager
def handlers_deferred() -> Iterator[None]:
    """Within: exit handlers registered *by this thread* are kept for :func:`run_deferred`; other
    threads' registrations go to ``atexit`` as usual."""
    me = threading.get_ident()
    with _patch_lock:
        real = atexit.register

        def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
            if threading.get_ident() != me:
                return real(func, *args, **kwargs)
            _deferred.append((func, args, kwargs))
            return func

        atexit.register = register  # type: ignore[assignment]
        try:
            yield
        finally:
            atexit.register = real


def run_deferred() -> None:
    """Run the kept handlers, newest first (as ``atexit`` would have), each once."""
    while _deferred:
        func, args, kwargs = _deferred.pop()
        try:
            func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - as atexit does: say it, and run the others
            logger.exception("exit handler %r failed", func)
