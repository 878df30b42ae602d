"""The actor runtime: actors, endpoints, proc meshes, futures, supervision.

Layering: imports ``rlmesh.transport`` only; never torch models, DuckDB or
weight transports (those plug in through :mod:`rlmesh.actor.hooks`).

Names load on first use (PEP 562): a worker imports ``rlmesh.actor.worker`` and what it
needs, not the controller side (supervision, proc meshes, the launcher protocol). That is
part of how long a proc takes to start, which every run pays (issue 16).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    "Actor": "rlmesh.actor.actor",
    "endpoint": "rlmesh.actor.actor",
    "Context": "rlmesh.actor.context",
    "ProcInfo": "rlmesh.actor.context",
    "context": "rlmesh.actor.context",
    "current_context": "rlmesh.actor.context",
    "Restart": "rlmesh.actor.controller",
    "Future": "rlmesh.actor.future",
    "ActorMesh": "rlmesh.actor.mesh",
    "Endpoint": "rlmesh.actor.mesh",
    "ProcMesh": "rlmesh.actor.proc_mesh",
    "Shape": "rlmesh.actor.shape",
    "ValueMesh": "rlmesh.actor.shape",
}

__all__ = [
    "Actor",
    "ActorMesh",
    "Context",
    "Endpoint",
    "Future",
    "ProcInfo",
    "ProcMesh",
    "Restart",
    "Shape",
    "ValueMesh",
    "context",
    "current_context",
    "endpoint",
]


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlmesh.actor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])


if TYPE_CHECKING:  # pragma: no cover
    from rlmesh.actor.actor import Actor, endpoint
    from rlmesh.actor.context import Context, ProcInfo, context, current_context
    from rlmesh.actor.controller import Restart
    from rlmesh.actor.future import Future
    from rlmesh.actor.mesh import ActorMesh, Endpoint
    from rlmesh.actor.proc_mesh import ProcMesh
    from rlmesh.actor.shape import Shape, ValueMesh
