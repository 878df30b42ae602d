"""The actor runtime: actors, endpoints, proc meshes, futures, supervision.

Layering: imports ``rlmesh.transport`` only; never torch models, DuckDB or
weight transports (those plug in through :mod:`rlmesh.actor.hooks`).
"""

from rlmesh.actor.actor import Actor, endpoint
from rlmesh.actor.context import Context, ProcInfo, context, current_context
from rlmesh.actor.controller import Restart
from rlmesh.actor.future import Future
from rlmesh.actor.mesh import ActorMesh, Endpoint
from rlmesh.actor.proc_mesh import ProcMesh
from rlmesh.actor.shape import Shape, ValueMesh

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
