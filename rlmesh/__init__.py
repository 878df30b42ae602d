"""rlmesh: reinforcement-learning workloads on meshes of actors.

The front door is small and lazy: ``import rlmesh`` loads no torch, DuckDB or
kubernetes; each name is imported on first use.

    import rlmesh as rm
    procs = rm.this_host().spawn_procs(per_host={"procs": 4})
    scorers = procs.spawn("scorer", Scorer, scale=0.5)
    scorers.score.call("abc").get()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_NAMES = {
    "Actor": "rlmesh.actor.actor",
    "endpoint": "rlmesh.actor.actor",
    "context": "rlmesh.actor.context",
    "Restart": "rlmesh.actor.controller",
    "Future": "rlmesh.actor.future",
    "ValueMesh": "rlmesh.actor.shape",
    "ActorMesh": "rlmesh.actor.mesh",
    "ProcMesh": "rlmesh.actor.proc_mesh",
    "this_host": "rlmesh.launch",
    "RlmeshError": "rlmesh.errors",
    "ActorError": "rlmesh.errors",
    "ActorDied": "rlmesh.errors",
    "CallTimeout": "rlmesh.errors",
    "ConfigError": "rlmesh.errors",
    "SerializationError": "rlmesh.errors",
    "WeightSyncError": "rlmesh.errors",
}
_SUBMODULES = {"telemetry", "weights", "rl", "actor", "transport", "launch", "errors"}

# Layers above the runtime plug in here by name; nothing is imported until the first proc launches.
# With each, the modules its workers import (telemetry's worker plugin), for the start-up template.
_CONTROLLER_PLUGINS = (
    ("rlmesh.telemetry.plugin:on_controller_start", ("rlmesh.telemetry.plugin",)),
    ("rlmesh.weights.plugin:on_controller_start", ()),
)


def _register_plugins() -> None:
    from rlmesh.actor import hooks  # deferred: the front door stays light: the runtime loads on first use

    for spec, worker_modules in _CONTROLLER_PLUGINS:
        package = spec.partition(":")[0].rsplit(".", 1)[0]  # find_spec of the package imports nothing heavy
        if importlib.util.find_spec(package) is not None:
            hooks.register_controller_plugin(spec, worker_modules)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        mod = importlib.import_module(f"rlmesh.{name}")
        globals()[name] = mod
        return mod
    raise AttributeError(f"module 'rlmesh' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES, *_SUBMODULES])


import importlib.util  # noqa: E402

_register_plugins()

if TYPE_CHECKING:  # pragma: no cover - what a checker sees; `X as X` marks each name as re-exported (PEP 484)
    from rlmesh.actor.actor import Actor as Actor, endpoint as endpoint
    from rlmesh.actor.context import context as context
    from rlmesh.actor.controller import Restart as Restart
    from rlmesh.actor.future import Future as Future
    from rlmesh.actor.mesh import ActorMesh as ActorMesh
    from rlmesh.actor.proc_mesh import ProcMesh as ProcMesh
    from rlmesh.actor.shape import ValueMesh as ValueMesh
    from rlmesh.errors import (ActorDied as ActorDied, ActorError as ActorError, CallTimeout as CallTimeout,
                               ConfigError as ConfigError, RlmeshError as RlmeshError,
                               SerializationError as SerializationError, WeightSyncError as WeightSyncError)
    from rlmesh.launch import this_host as this_host

