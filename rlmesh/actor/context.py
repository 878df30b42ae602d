"""``rm.context()``: who am I? Rank, mesh shape, mesh name, proc and actor id.

Set by the worker around ``__init__``, every endpoint call and ``on_restart`` (a
``contextvars`` variable, so it follows asyncio tasks and the actor's own thread).
Outside an actor (the controller, a plain script) :func:`current_context` returns
``None`` and :func:`context` raises with a hint.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass

from rlmesh import settings

JOB_ID_ENV = settings.JOB_ID.name


@dataclass(frozen=True)
class ProcInfo:
    """The process an actor lives in. ``proc_id`` is stable across restarts; ``incarnation`` counts them."""

    proc_id: str
    proc_mesh: str
    rank: int
    pid: int
    host: str
    incarnation: int
    job_id: str


@dataclass(frozen=True)
class Context:
    """What an actor knows about its place in the mesh."""

    rank: int
    shape: dict[str, int]
    coords: dict[str, int]
    mesh_name: str
    actor_id: str
    proc: ProcInfo


_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar("rlmesh_context", default=None)
current_context_var = _current
"""The variable behind :func:`current_context`, read-only by convention: a per-row hot path (telemetry's
``record()``) calls its ``get`` without a Python frame in between."""
_this_proc: ProcInfo | None = None


_stopping = threading.Event()


def proc_stopping() -> bool:
    """True once this proc was asked to stop (its controller's ``stop``, SIGTERM).

    Why: an endpoint still running when its proc stops holds the actor's thread, so ``on_stop``
    and the exit wait behind it; one blocked in a framework wait that can no longer end (a
    generator waiting for a weight version its stopped trainer will never publish) held every
    run's teardown for the whole stop timeout (5 s) before the proc was killed, its last telemetry
    rows lost. Framework waits (:meth:`rlmesh.weights.Subscriber.pull_into`, a worker's
    ``rm.actor.kv.get``) check this and give up at once; a long user loop may too.
    """
    return _stopping.is_set()


def _mark_stopping() -> None:
    _stopping.set()


def current_context() -> Context | None:
    """The calling actor's context, or ``None`` outside any actor."""
    return _current.get()


def context() -> Context:
    """The calling actor's context; raises ``RuntimeError`` outside an actor."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "rm.context() is only available inside an actor's __init__, endpoints or on_restart; "
            "the controller has no rank"
        )
    return ctx


def current_proc() -> ProcInfo | None:
    """This worker process's identity, or ``None`` in the controller."""
    return _this_proc


def job_id() -> str | None:
    """The id shared by the controller and every worker of one job (``RLMESH_JOB_ID``)."""
    return settings.JOB_ID.raw()


def _set_proc(info: ProcInfo) -> None:
    global _this_proc
    _this_proc = info
