"""Versioned weight sync: a trainer publishes, generators pull, over shm, TCP, RDMA or CUDA IPC.

    pub = rm.weights.Publisher("policy")
    pub.publish(model.state_dict(), version=step)
    sub = rm.weights.Subscriber("policy")
    v = sub.pull_into(model.state_dict(), min_version=k, timeout=30)

See ``docs/weights.md`` for versions, transports and how one is chosen.
"""

from rlmesh.weights.errors import StateDictMismatchError, TransportUnavailableError, WeightSyncError
from rlmesh.weights.publisher import Publisher
from rlmesh.weights.stats import PublishStats, SyncStats, Version
from rlmesh.weights.subscriber import Subscriber

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
