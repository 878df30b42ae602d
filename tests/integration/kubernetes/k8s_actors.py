"""Actors the Kubernetes tests run in pods (the fake kubelet's "image" has this folder on PYTHONPATH)."""

import asyncio
import os

import rlmesh as rm


class Probe(rm.Actor):
    def __init__(self, tag: str = "probe"):
        self.tag = tag
        self.restarted = False

    @rm.endpoint
    def where(self) -> dict:
        c = rm.context()
        return {"rank": c.rank, "incarnation": c.proc.incarnation, "tag": self.tag,
                "pod": os.environ.get("RLMESH_POD_NAME"), "advertise": os.environ.get("RLMESH_ADVERTISE_HOST"),
                "secret_set": bool(os.environ.get("RLMESH_SECRET")), "extra": os.environ.get("RLMESH_TEST_EXTRA")}

    @rm.endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @rm.endpoint
    def say(self, text: str) -> None:
        print(f"{text} from rank {rm.context().rank}", flush=True)

    @rm.endpoint
    async def sleep(self, s: float) -> int:
        await asyncio.sleep(s)
        return rm.context().rank

    @rm.endpoint
    def pause(self, x: int) -> int:
        y = x + 1
        breakpoint()  # the debugger test attaches from the controller's side and changes y
        return y * 2

    @rm.endpoint
    def was_restarted(self) -> bool:
        return self.restarted

    def on_restart(self) -> None:
        self.restarted = True
