"""Actors of the network-namespace tests (imported by scenario.py's procs, on their hosts)."""

import os
import socket

import numpy as np

import rlmesh as rm


class Peer(rm.Actor):
    """Says where it runs, echoes, records telemetry rows, pauses for a debugger, publishes and pulls weights."""

    @rm.endpoint
    async def where(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "rank": rm.context().rank}

    @rm.endpoint
    async def echo(self, payload: bytes) -> bytes:
        return payload

    @rm.endpoint
    def record(self, n: int) -> int:
        for i in range(n):
            rm.telemetry.record("netns_rows", i=i, host=socket.gethostname(), rank=rm.context().rank)
        rm.telemetry.flush()
        return n

    @rm.endpoint
    def pause(self) -> int:
        answer = 1
        breakpoint()  # the test's debugger session sets answer = 42 from another host's namespace
        return answer

    @rm.endpoint
    def publish(self, mib: int, version: int) -> float:
        # numpy arrays, not torch tensors: no proc of these tests imports torch (seconds of CPU each)
        w = np.random.default_rng(version).random(mib * (1 << 18), dtype=np.float32)
        self.weights = {"w": w, "b": np.arange(7, dtype=np.float32) * version}
        if not hasattr(self, "pub"):
            self.pub = rm.weights.Publisher("netns-policy")
        self.pub.publish(self.weights, version=version)
        return float(w.astype(np.float64).sum())

    @rm.endpoint
    def pull(self, min_version: int) -> dict:
        sub = rm.weights.Subscriber("netns-policy")
        try:
            sd, v = sub.pull(min_version=min_version, timeout=60)
        finally:
            sub.close()
        return {"version": int(v), "transport": str(v.stats.transport), "bytes": v.stats.bytes,
                "sum": float(sd["w"].astype(np.float64).sum()), "b": sd["b"].tolist(), "host": socket.gethostname()}

    @rm.endpoint
    def imported(self) -> str:
        import netns_synced  # from the tree sync_workspace landed on this host

        return netns_synced.WHERE


class Worker(rm.Actor):
    """One unit of work at a time: which host and pid did item ``i``."""

    @rm.endpoint
    async def work(self, i: int) -> dict:
        return {"i": i, "host": socket.gethostname(), "pid": os.getpid(), "rank": rm.context().rank}
