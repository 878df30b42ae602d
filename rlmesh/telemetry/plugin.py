"""Wiring into the actor runtime: lifecycle events -> ``actors``, endpoint calls -> ``spans``.

``rlmesh/__init__.py`` registers :func:`on_controller_start` as a controller plugin;
the env it returns makes every worker run :func:`on_worker_start`. Neither the
runtime nor this module imports the other's internals: they meet in
``rlmesh.actor.hooks``.

Span sampling, per proc and per (actor, endpoint): up to ``RLMESH_SPANS_MAX_PER_S``
rows a second (default 1000); beyond that calls are counted, not recorded, and the
next recorded row carries them in ``weight``, so ``sum(weight)`` still counts every
call. Errors are always recorded. ``RLMESH_SPANS=0`` turns span recording off.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from rlmesh import settings
from rlmesh.actor import hooks
from rlmesh.actor.debugger import DEBUG_DIR_ENV
from rlmesh.telemetry import api, logs
from rlmesh.telemetry.health import HealthSampler
from rlmesh.transport.refusals import RefusalReport, set_refusal_sink

logger = logging.getLogger(__name__)

SPANS_ENV = settings.SPANS.name
SPANS_MAX_ENV = settings.SPANS_MAX_PER_S.name
WORKER_PLUGIN = "rlmesh.telemetry.plugin:on_worker_start"

_health: Any = None


def on_controller_start(info: hooks.ControllerInfo) -> dict[str, str]:
    """Start the run (if not yet), record proc lifecycle events, and tell workers where to ship rows."""
    env = api.worker_env()
    if not env:  # telemetry off, or this controller is itself a worker of another run
        return {}
    hooks.add_event_sink(record_proc_event)
    set_refusal_sink(record_refusal)
    logs.install()  # procs' output -> logs, stack dumps -> stacks
    env[hooks.WORKER_PLUGINS_ENV] = WORKER_PLUGIN
    run_dir = api.current_run_dir()
    if run_dir is not None:  # paused actors register here, where `rlmesh debug RUN` looks
        env[DEBUG_DIR_ENV] = str(run_dir / "debug")
    return env


def record_refusal(r: RefusalReport) -> None:
    """Refusal sink: one ``refusals`` row per rate-limited report (so a flood costs a row per 10 s).
    Reports after the run ended are not recorded (they must not start a new run)."""
    rec = api.active_recorder()
    if rec is None:
        return
    rec.record_trusted("refusals", {
        "channel": r.channel, "peer": r.peer, "reason": r.reason, "count": r.count,
        "rejected_total": r.rejected_total, "replayed_total": r.replayed_total,
    })


def record_proc_event(ev: hooks.ProcEvent) -> None:
    """Event sink: one ``actors`` row per lifecycle event (runs on the supervisor thread: cheap).
    Events after the run ended are not recorded (they must not start a new run)."""
    rec = api.active_recorder()
    if rec is None:
        return
    rec.record_trusted("actors", {
        "mesh": ev.proc_mesh, "rank": ev.rank, "proc": ev.proc_id, "host": ev.host,
        "event": ev.kind, "pid": ev.pid, "incarnation": ev.incarnation,
        "exit_code": ev.exit_code, "signal": ev.signal, "reason": ev.reason or None,
        "actors": ",".join(ev.actors) or None, "recovery_s": ev.recovery_s,
        "serving_s": ev.serving_s,
    }, ts=ev.ts)


def record_debug_pause(p: hooks.DebugPause) -> None:
    """Debug sink (workers): one ``debug_sessions`` row when an actor pauses for a debugger and one
    when it resumes, flushed at once: ``rlmesh debug`` lists pauses from them, on any host."""
    rec = api.active_recorder()
    if rec is None:
        return
    rec.record_trusted("debug_sessions", dataclasses.asdict(p))  # the columns are its fields
    rec.flush()


class SpanSampler:
    """The worker's span sink: rate-limited per endpoint, errors always kept."""

    def __init__(self, rec: Any, max_per_s: float | None = None):
        self._rec = rec
        self.max_per_s = settings.SPANS_MAX_PER_S.get() if max_per_s is None else max_per_s
        self._window: dict[tuple[str, str], list[float]] = {}  # key -> [window_start, recorded, skipped]

    def __call__(self, span: hooks.Span) -> None:
        now = time.time()
        key = (span.actor_id, span.endpoint)
        w = self._window.get(key)
        if w is None or now - w[0] >= 1.0:
            skipped = w[2] if w else 0
            w = self._window[key] = [now, 0, skipped]
        if w[1] >= self.max_per_s and span.outcome == "ok":
            w[2] += 1
            return
        weight = 1 + int(w[2])
        w[1] += 1
        w[2] = 0
        self._rec.record_trusted("spans", {
            "mesh": span.mesh, "rank": span.rank, "actor_id": span.actor_id,
            "endpoint": span.endpoint, "caller": span.caller, "start_ts": span.start_ts,
            "duration_s": span.duration_s, "outcome": span.outcome, "error": span.error or None,
            "bytes_in": span.bytes_in, "bytes_out": span.bytes_out, "weight": weight,
        }, ts=now)


def on_worker_start(info: hooks.WorkerInfo) -> None:
    """In each worker: record spans, take part in the per-host health election, flush at exit."""
    global _health
    rec = api.recorder()
    if rec.run_id is None:  # telemetry off
        return
    if settings.SPANS.get():
        hooks.set_span_sink(SpanSampler(rec))
    set_refusal_sink(record_refusal)
    hooks.set_debug_sink(record_debug_pause)
    _health = HealthSampler(rec.record_trusted, rec.run_id).start()
    hooks.add_shutdown_hook(_worker_shutdown)


def _worker_shutdown() -> None:
    if _health is not None:
        _health.stop()
    api.end_run()
