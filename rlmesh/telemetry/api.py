"""The process-wide telemetry state behind ``rm.telemetry.record/query/flush``.

A process is in one of three modes, decided on first use:

- **controller** (no telemetry address in the environment): the first ``record()`` or
  ``spawn_procs`` starts a run: ``runs/<run_id>/``, the in-process service, the host
  sampler. It ends at interpreter exit (status ``ok``, or ``failed`` after an uncaught
  exception) or at :func:`end_run`.
- **worker** (``RLMESH_TELEMETRY_ADDR`` and ``RLMESH_RUN_ID`` set by the controller
  plugin): rows go over zmq to the controller's service.
- **off** (``RLMESH_TELEMETRY=0``): ``record()`` does nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from rlmesh import settings
from rlmesh.actor import hooks
from rlmesh.actor.context import current_proc
from rlmesh.telemetry import exit_order
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.client import RemoteSink
from rlmesh.telemetry.health import HealthSampler
from rlmesh.telemetry.recorder import Recorder
from rlmesh.telemetry.service import TelemetryService
from rlmesh.transport import Authenticator

logger = logging.getLogger(__name__)

ADDR_ENV = settings.TELEMETRY_ADDR.name
QUERY_ADDR_ENV = settings.TELEMETRY_QUERY_ADDR.name
RUN_ID_ENV = settings.RUN_ID.name
ENABLE_ENV = settings.TELEMETRY.name
RAW_MAX_ROWS = 256
"""A worker's flush of at most this many rows ships them unconverted and the service makes them
Arrow (:class:`~rlmesh.telemetry.wire.RawRows`): a proc that records little never loads
pyarrow. Busier procs convert their own rows, so the service's one writer thread stays the only
per-row cost that grows with the number of procs."""

_lock = threading.RLock()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)
_rec: Any = None
_pid = -1
_svc: Any = None  # TelemetryService, controller only
_health: Any = None
_failed: tuple[str, str | None] | None = None  # (status, error) an uncaught exception ended the controller with
_hooked = False


class _Off:
    run_id = None

    def record(self, table: str, row: dict[str, Any]) -> None:
        pass

    record_trusted = record

    def record_batch(self, table: str, data: Any) -> None:
        pass

    def record_trusted_items(self, table: str, items: Any, to_table: Any) -> None:
        pass

    def flush(self) -> int:
        return 0

    def raise_refused(self) -> None:
        pass

    def close(self) -> None:
        pass


def recorder() -> Any:
    """This process's recorder, creating it (and, in a controller, the run) on first use."""
    if _rec is not None and _pid == os.getpid():
        return _rec
    with _lock:
        if _rec is not None and _pid == os.getpid():
            return _rec
        if _rec is not None:  # forked: the parent's threads are gone here
            _adopt_after_fork()
        if _rec is None:
            if not enabled():
                _set(_Off())
            elif _is_worker():
                _start_worker(settings.TELEMETRY_ADDR.get(), settings.RUN_ID.get(), settings.TELEMETRY_QUERY_ADDR.raw())
            else:
                start_run()
        return _rec


def enabled() -> bool:
    """False when ``RLMESH_TELEMETRY`` is 0/false/off/no."""
    return settings.TELEMETRY.get()


def _is_worker() -> bool:
    """The controller handed this process a run to record into (``RLMESH_TELEMETRY_ADDR``, ``RLMESH_RUN_ID``)."""
    return settings.TELEMETRY_ADDR.is_set() and settings.RUN_ID.is_set()


def _set(rec: Any) -> None:
    global _rec, _pid
    _rec, _pid = rec, os.getpid()


def _adopt_after_fork() -> None:
    global _rec, _svc, _health
    addr = _svc.ingest_addr if _svc is not None else settings.TELEMETRY_ADDR.raw()
    query_addr = _svc.query_addr if _svc is not None else settings.TELEMETRY_QUERY_ADDR.raw()
    run_id = getattr(_rec, "run_id", None)
    _rec = _svc = _health = None
    if addr and run_id:
        _start_worker(addr, run_id, query_addr)


def _auth() -> Any:
    if not settings.SECRET.is_set():  # a plain script: later-spawned workers inherit this one
        settings.SECRET.set(Authenticator.new_secret().hex())
    return Authenticator.from_env()


def _start_worker(addr: str, run_id: str, query_addr: str | None) -> None:
    proc = current_proc()
    origin = proc.proc_id if proc else f"pid{os.getpid()}"
    _set(Recorder(run_id, RemoteSink(addr, _auth(), origin, query_addr), raw_max_rows=RAW_MAX_ROWS))


def start_run(config: Any = None, *, run_id: str | None = None,
              runs_dir: str | os.PathLike[str] | None = None, resume: bool = False) -> str | None:
    """Start this controller's run now (normally implicit); returns its id (``None`` when telemetry is off).

    Call it explicitly to attach a config (``runs.config``) or choose where the run goes;
    if a run is already going, ``config`` is stored on it and its id returned.
    ``resume=True`` with the ``run_id`` of an earlier run (its controller died) appends to
    that run's database instead: same id, its ``runs`` row back to ``running``.
    """
    global _svc, _health, _hooked
    if not enabled():
        _set(_Off())
        return None
    with _lock:
        if _svc is not None and _pid == os.getpid():
            if config is not None:
                _svc.set_config(config)
            return _svc.run_id
        root = Path(runs_dir).resolve() if runs_dir else runs.runs_dir()
        if resume and not run_id:
            raise ValueError("start_run(resume=True) needs the run_id of the run to continue")
        run_id = run_id or runs.new_run_id()
        d = runs.reopen_run_dir(run_id, root) if resume else runs.create_run_dir(run_id, root)
        if not _hooked:  # before the service starts: its opener defers the exit handlers of what it imports
            _hooked = True
            atexit.register(_at_exit)
            prev = sys.excepthook

            def hook(*exc: Any) -> None:
                global _failed
                _failed = exit_status(exc[1])
                prev(*exc)

            sys.excepthook = hook
        # The database opens on the service's own thread (DuckDB, pyarrow: ~0.3 s), while procs start;
        # a resume opens it first, so that a run that cannot be reopened fails here.
        _svc = TelemetryService(d, run_id, _auth(), config, resume=resume,
                                importing=exit_order.handlers_deferred).start(wait=resume)
        _set(Recorder(run_id, _svc.ingest))
        _health = HealthSampler(_rec.record_trusted, run_id).start()
        return run_id


def exit_status(exc: BaseException | None) -> tuple[str, str | None]:
    """``(status, error)`` of a run that ``exc`` ended: ``interrupted`` for Ctrl-C/SIGTERM
    (``KeyboardInterrupt``), ``failed`` with the exception's first line otherwise, ``ok`` for none."""
    if exc is None:
        return "ok", None
    line = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", line or "interrupted (Ctrl-C or SIGTERM)"
    return "failed", f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def end_run(status: str | None = None, error: str | None = None) -> None:
    """Flush, mark the run ``ok``/``failed``/``interrupted`` (``error``: why, kept in ``runs.error``)
    and close its file. A later ``record()`` starts a new run, and so does the next proc launch:
    procs launched after this point ship their rows to that new run (procs still running keep
    the ended run's address; their late rows are dropped with a warning)."""
    global _rec, _svc, _health
    if status is None:
        status, error = _failed or ("ok", None)
    with _lock:
        if _pid != os.getpid():
            return
        if _health is not None:
            _health.stop(unlink=_svc is not None)
        if _rec is not None:
            _rec.close()
        if _svc is not None:
            _svc.stop(status, error)
        elif _rec is not None and hasattr(_rec, "_sink"):
            sink = _rec._sink
            if hasattr(sink, "close"):
                sink.close()
        ended_controller_run = _svc is not None
        _rec = _svc = _health = None
        sys.modules["rlmesh.telemetry"]._rec = None  # type: ignore[attr-defined]  # record()'s cache
    if ended_controller_run:  # procs launched from now on belong to the next run, not this ended one
        hooks.invalidate_controller_plugins()


def _at_exit() -> None:
    """The run's exit handler; then the exit handlers of DuckDB and pyarrow, which must come after it."""
    try:
        finish_run()
    finally:
        exit_order.run_deferred()


def finish_run(status: str | None = None, error: str | None = None) -> None:
    """End the controller's run for good: stop the runtime's procs first (if any are still up), so
    that their last rows and their ``stopped`` events reach the run, then :func:`end_run`. What
    interpreter exit does, and what a CLI calls when it ends a run itself (a failure, a signal)."""
    ctl_mod = sys.modules.get("rlmesh.actor.controller")
    ctl = ctl_mod.Controller.current() if ctl_mod is not None else None
    if ctl is not None and _svc is not None and not getattr(ctl, "_closed", True):
        try:
            ctl.shutdown()  # idempotent; the runtime's own atexit call then does nothing
        except Exception:
            logger.exception("telemetry: stopping the procs before finishing the run failed")
    try:
        end_run(status, error)
    except Exception:
        logger.exception("telemetry: could not finish the run cleanly")


def active_recorder() -> Any:
    """This process's recorder if a run is going (or this is a worker), else ``None``: for
    framework rows (proc events) that must never start a run of their own, e.g. procs still
    stopping or respawning after the controller's run ended (a phantom run otherwise)."""
    if _rec is not None and _pid == os.getpid():
        return _rec
    if _is_worker() and enabled():
        return recorder()
    return None


def service() -> Any:
    """The in-process service (controller only), else ``None``."""
    return _svc if _pid == os.getpid() else None


def flush(timeout: float = 10.0) -> None:
    """Ship this process's buffered rows now; in the controller, also wait until they are in the file.
    Then raise the :class:`SchemaError` of a refused row that no ``record()`` has raised yet."""
    rec = recorder()
    rec.flush()
    svc = service()
    if svc is not None:
        svc.sync(timeout, ticket=getattr(rec, "last_ticket", 0))
    rec.raise_refused()


def current_run() -> str | None:
    """Id of the run this process records into, or ``None`` if it records nowhere (yet)."""
    if _rec is not None and _pid == os.getpid():
        return _rec.run_id
    return settings.RUN_ID.raw()


def current_run_dir() -> Path | None:
    svc = service()
    return svc.run_dir if svc is not None else None


def worker_env() -> dict[str, str]:
    """Environment for worker procs of this controller's run (starts the run if needed)."""
    recorder()
    svc = service()
    if svc is None:
        return {}
    return {ADDR_ENV: svc.ingest_addr, QUERY_ADDR_ENV: svc.query_addr, RUN_ID_ENV: svc.run_id}
