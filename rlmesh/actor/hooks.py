"""Where higher layers plug into the runtime without the runtime importing them.

Why: ``rlmesh.actor`` must not import DuckDB, torch models or weight transports,
yet telemetry needs every proc death and every endpoint call, and weight sync
needs a place to clean up shared memory when a proc stops. So the runtime emits
plain dataclasses to sinks that those layers register, and starts *plugins* named
by ``"module:function"`` strings that it imports only when first needed.

Controller side:
    - ``add_event_sink(fn)``: ``fn(ProcEvent)`` for every lifecycle event (spawned,
      died, restarted, stopped, gave_up). Called on the supervisor thread: be quick.
    - ``register_controller_plugin("pkg.mod:fn")``: ``fn(ControllerInfo)`` runs once,
      just before the first proc is launched; it may return a dict of environment
      variables that every worker then gets (e.g. a telemetry service address).
      ``invalidate_controller_plugins()`` makes the next launch run them again.
Worker side:
    - plugins listed in ``RLMESH_WORKER_PLUGINS`` (comma-separated ``"mod:fn"``) run at
      worker start with a :class:`WorkerInfo`.
    - ``set_span_sink(fn)``: ``fn(Span)`` after every endpoint call in this proc.
    - ``set_debug_sink(fn)``: ``fn(DebugPause)`` when an actor pauses for a debugger or resumes.
    - ``add_shutdown_hook(fn)``: runs when the worker exits cleanly (stop or SIGTERM).
    - ``set_sigterm_handler(fn)``: ``fn()`` decides what SIGTERM means for this proc (True: handled,
      keep serving); without one, SIGTERM stops the worker cleanly.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rlmesh import settings

logger = logging.getLogger(__name__)

WORKER_PLUGINS_ENV = settings.WORKER_PLUGINS.name


@dataclass(frozen=True)
class ProcEvent:
    """One lifecycle event of one proc (and the actors it hosts).

    ``kind``: ``spawned`` (first start, or a restart's new process joined),
    ``died`` (exit code or signal, or ``reason="heartbeat timeout"``),
    ``restarted`` (its actors were re-created), ``stopped`` (clean shutdown),
    ``gave_up`` (``max_restarts`` exhausted), ``fault_injected`` (built-in fault injection),
    ``restart_requested`` (killed on purpose to run new code: ``sync_workspace(reload="auto")``),
    ``fenced`` (an incarnation already replaced dialled in again, its host's link back: told to exit),
    ``recovered`` (a replacement made progress: the program said so, :meth:`Controller.progressed`).
    ``serving_s`` (``restarted`` and ``recovered``): seconds from the injected fault, or else from
    the death, until the replacement's actors were re-created and serving.
    ``recovery_s`` (``recovered`` only): seconds from the same moment until the replacement made
    progress (a recipe's trainer finished a train step, a generator's rollout landed).
    """

    kind: str
    proc_mesh: str
    rank: int
    proc_id: str
    pid: int | None
    host: str
    incarnation: int
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    actors: tuple[str, ...] = ()
    recovery_s: float | None = None
    serving_s: float | None = None
    ts: float = field(default_factory=time.time)


@dataclass(slots=True)
class Span:
    """One endpoint call as seen by the proc that served it.

    Slotted, not frozen: one is made per call served, and a frozen dataclass's ``__init__`` costs
    three times as much (1.6 against 0.55 µs). Sinks read it; none should change it."""

    mesh: str
    actor_id: str
    rank: int
    endpoint: str
    caller: str
    start_ts: float
    duration_s: float
    outcome: str  # "ok" | "error"
    bytes_in: int
    bytes_out: int
    error: str = ""


@dataclass(frozen=True)
class DebugPause:
    """An actor paused for a debugger (``breakpoint()`` or post-mortem), or resumed again.

    ``event``: ``paused`` or ``resumed``. ``addr`` is the paused actor's debugger socket (unique
    per pause): what ``rlmesh debug --attach`` dials, from any host that can reach the proc.
    """

    event: str
    actor: str
    mesh: str | None
    rank: int | None
    proc: str | None
    host: str
    pid: int
    addr: str
    file: str
    line: int
    function: str
    reason: str
    since: float


@dataclass(frozen=True)
class ControllerInfo:
    """Handed to controller plugins: enough to start services next to the controller."""

    controller_addr: str
    pid: int
    host: str


@dataclass(frozen=True)
class WorkerInfo:
    """Handed to worker plugins at start."""

    proc_id: str
    proc_mesh: str
    rank: int
    incarnation: int
    pid: int
    host: str
    controller_addr: str


_lock = threading.Lock()
_event_sinks: list[Callable[[ProcEvent], None]] = []
_controller_plugins: list[str] = []
_worker_module_hints: list[str] = []
_span_sink: Callable[[Span], None] | None = None
_debug_sink: Callable[[DebugPause], None] | None = None
_sigterm_handler: Callable[[], bool] | None = None
_shutdown_hooks: list[Callable[[], None]] = []


def _resolve(spec: str) -> Callable[..., Any]:
    mod, _, fn = spec.partition(":")
    if not fn:
        raise ValueError(f"plugin {spec!r} must be 'module:function'")
    return getattr(importlib.import_module(mod), fn)


def add_event_sink(fn: Callable[[ProcEvent], None]) -> None:
    with _lock:
        if fn not in _event_sinks:
            _event_sinks.append(fn)


def remove_event_sink(fn: Callable[[ProcEvent], None]) -> None:
    with _lock:
        if fn in _event_sinks:
            _event_sinks.remove(fn)


def emit_event(ev: ProcEvent) -> None:
    """Log the event and hand it to every sink; a failing sink is logged, never raised."""
    level = logging.WARNING if ev.kind in ("died", "gave_up") else logging.INFO
    logger.log(
        level,
        "proc %s[%d] %s (pid=%s incarnation=%d%s%s%s)",
        ev.proc_mesh, ev.rank, ev.kind, ev.pid, ev.incarnation,
        f" exit_code={ev.exit_code}" if ev.exit_code is not None else "",
        f" signal={ev.signal}" if ev.signal is not None else "",
        f" reason={ev.reason}" if ev.reason else "",
    )
    with _lock:
        sinks = list(_event_sinks)
    for sink in sinks:
        try:
            sink(ev)
        except Exception:
            logger.exception("event sink %r failed", sink)


def register_controller_plugin(spec: str, worker_modules: tuple[str, ...] = ()) -> None:
    """Run ``spec`` (``"pkg.mod:fn"``) when the controller first launches procs.

    ``worker_modules``: what the worker plugins it will name import (their modules). The local
    launcher's start-up template imports them while the controller is still running its plugins,
    so the first procs are forked with them loaded instead of waiting for the import (issue 16).
    """
    with _lock:
        if spec not in _controller_plugins:
            _controller_plugins.append(spec)
        for mod in worker_modules:
            if mod not in _worker_module_hints:
                _worker_module_hints.append(mod)


def worker_module_hints() -> tuple[str, ...]:
    """Modules the registered controller plugins said their workers will import."""
    with _lock:
        return tuple(_worker_module_hints)


_plugins_generation = 0


def invalidate_controller_plugins() -> None:
    """Make the next proc launch run the controller plugins again (e.g. telemetry started a new run)."""
    global _plugins_generation
    _plugins_generation += 1


def controller_plugins_generation() -> int:
    return _plugins_generation


def run_controller_plugins(info: ControllerInfo) -> dict[str, str]:
    """Import and run every registered controller plugin; merge the env they return."""
    env: dict[str, str] = {}
    with _lock:
        specs = list(_controller_plugins)
    for spec in specs:
        try:
            out = _resolve(spec)(info)
        except ImportError as exc:
            logger.warning("controller plugin %s is not available (%s); continuing without it", spec, exc)
            continue
        except Exception:
            logger.exception("controller plugin %s failed; continuing without it", spec)
            continue
        for k, v in (out or {}).items():
            k, v = str(k), str(v)
            if k == WORKER_PLUGINS_ENV and env.get(k):
                v = f"{env[k]},{v}"  # several plugins may each add worker plugins
            env[k] = v
    return env


def run_worker_plugins(info: WorkerInfo) -> None:
    for spec in filter(None, (s.strip() for s in settings.WORKER_PLUGINS.get().split(","))):
        try:
            _resolve(spec)(info)
        except Exception:
            logger.exception("worker plugin %s failed; continuing without it", spec)


def set_span_sink(fn: Callable[[Span], None] | None) -> None:
    global _span_sink
    _span_sink = fn


def span_sink() -> Callable[[Span], None] | None:
    return _span_sink


def set_debug_sink(fn: Callable[[DebugPause], None] | None) -> None:
    """``fn(DebugPause)`` when an actor of this proc pauses for a debugger and when it resumes
    (telemetry records them, so ``rlmesh debug`` finds actors paused on other hosts)."""
    global _debug_sink
    _debug_sink = fn


def debug_sink() -> Callable[[DebugPause], None] | None:
    return _debug_sink


def set_sigterm_handler(fn: Callable[[], bool] | None) -> None:
    """``fn()`` runs on the worker's loop when the proc gets SIGTERM; True means it handled the signal
    and the worker keeps serving, False that the worker stops cleanly as usual.

    Why: to a Slurm job step SIGTERM is Slurm's notice that the whole job is ending (preemption, the
    time limit), and the run's orderly stop (the trainer's final checkpoint) is the controller's to
    lead: the Slurm launcher's worker plugin reports the signal to the controller instead of exiting."""
    global _sigterm_handler
    _sigterm_handler = fn


def sigterm_handler() -> Callable[[], bool] | None:
    return _sigterm_handler


def add_shutdown_hook(fn: Callable[[], None]) -> None:
    with _lock:
        _shutdown_hooks.append(fn)


def run_shutdown_hooks() -> None:
    with _lock:
        hooks = list(reversed(_shutdown_hooks))
        _shutdown_hooks.clear()
    for fn in hooks:
        try:
            fn()
        except Exception:
            logger.exception("shutdown hook %r failed", fn)
