"""The actor of ``shaped_links.py``, in a module of its own: procs on other hosts import it by name."""

from __future__ import annotations

import time

import torch

import rlmesh as rm


class Peer(rm.Actor):
    """Answers pings; publishes a version of ``mib`` MiB of weights; pulls a version into a buffer it keeps."""

    def __init__(self) -> None:
        self.pub: rm.weights.Publisher | None = None
        self.sub: rm.weights.Subscriber | None = None
        self.weights: dict[str, torch.Tensor] = {}
        self.into: dict[str, torch.Tensor] = {}

    @rm.endpoint
    async def ping(self) -> None:
        return None

    @rm.endpoint
    def publish(self, mib: int, version: int) -> None:
        if self.weights.get("w") is None or self.weights["w"].numel() != mib << 18:
            self.weights = {"w": torch.rand(mib << 18)}
        self.weights["w"][0] = version
        if self.pub is None:
            self.pub = rm.weights.Publisher("shaped")
        self.pub.publish(self.weights, version=version)

    @rm.endpoint
    def pull(self, version: int) -> float:
        """Seconds to pull ``version`` into the buffer (in place, verified)."""
        if self.sub is None:
            self.sub = rm.weights.Subscriber("shaped")
        t = time.perf_counter()
        if not self.into:
            sd, v = self.sub.pull(version=version, timeout=600)
            self.into = sd
        else:
            v = self.sub.pull_into(self.into, version=version, timeout=600)
        took = time.perf_counter() - t
        assert int(v) == version and str(v.stats.transport) == "tcp", (int(v), v.stats.transport)
        return took
