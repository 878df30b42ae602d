"""Actors for the runtime tests of weight sync (workers import this by name: conftest puts it on sys.path)."""

import glob
import os
import signal

import torch

import rlmesh as rm


def versioned(v: int) -> dict:
    """A state_dict whose every value encodes its version, so a torn pull is visible in the values."""
    return {"emb": torch.full((1024, 64), float(v)), "w": torch.full((256, 256), v, dtype=torch.bfloat16),
            "step": torch.tensor(v, dtype=torch.int64)}


class Trainer(rm.Actor):
    def __init__(self, name: str = "policy"):
        self.pub = rm.weights.Publisher(name)

    @rm.endpoint
    def publish(self, version: int) -> int:
        return self.pub.publish(versioned(version), version=version).bytes

    @rm.endpoint
    def segments(self) -> list:
        return sorted(glob.glob(f"/dev/shm/rlmesh-w-*-{os.getpid()}-*"))

    @rm.endpoint
    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class Generator(rm.Actor):
    def __init__(self, name: str = "policy", transport: str | None = None):
        self.sub = rm.weights.Subscriber(name, transport)
        self.model = versioned(0)

    @rm.endpoint
    def pull(self, min_version: int) -> dict:
        v = self.sub.pull_into(self.model, min_version=min_version, timeout=30)
        consistent = all(bool((t.float() == float(v)).all()) for t in self.model.values())
        return {"version": int(v), "transport": v.stats.transport, "reader": v.stats.reader, "consistent": consistent,
                "latest": self.sub.latest_version(), "transports_tried": sorted(self.sub._logged)}


class Waiter(rm.Actor):
    """Pulls a version nobody will publish, after touching ``started`` (so a test knows it waits)."""

    def __init__(self, name: str = "policy"):
        self.sub = rm.weights.Subscriber(name)
        self.model = versioned(0)

    @rm.endpoint
    def pull_forever(self, min_version: int, started: str) -> int:
        open(started, "w").close()
        return int(self.sub.pull_into(self.model, min_version=min_version, timeout=60))
