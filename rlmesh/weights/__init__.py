"""Versioned weight sync: a trainer publishes, generators pull, over shm, TCP, RDMA or CUDA IPC.

    pub = rm.weights.Publisher("policy")
    pub.publish(model.state_dict(), version=step)
    sub = rm.weights.Subscriber("policy")
    v = sub.pull_into(model.state_dict(), min_version=k, timeout=30)

See ``docs/weights.md`` for versions, transports and how one is chosen.

Names load on first use: the controller's crash-cleanup plugin (:mod:`rlmesh.weights.plugin`)
runs at every run's start and needs neither numpy nor the transports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    "StateDictMismatchError": "rlmesh.weights.errors",
    "TransportUnavailableError": "rlmesh.weights.errors",
    "WeightSyncError": "rlmesh.weights.errors",
    "Publisher": "rlmesh.weights.publisher",
    "PublishStats": "rlmesh.weights.stats",
    "SyncStats": "rlmesh.weights.stats",
    "Version": "rlmesh.weights.stats",
    "Subscriber": "rlmesh.weights.subscriber",
}

__all__ = [
    "PublishStats",
    "Publisher",
    "StateDictMismatchError",
    "Subscriber",
    "SyncStats",
    "TransportUnavailableError",
    "Version",
    "WeightSyncError",
]


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlmesh.weights' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])


if TYPE_CHECKING:  # pragma: no cover
    from rlmesh.weights.errors import StateDictMismatchError, TransportUnavailableError, WeightSyncError
    from rlmesh.weights.publisher import Publisher
    from rlmesh.weights.stats import PublishStats, SyncStats, Version
    from rlmesh.weights.subscriber import Subscriber
