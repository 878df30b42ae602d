"""State that replay must not touch: a running total, and one telemetry row per addition."""

import rlmesh as rm


class Tally(rm.Actor):
    def __init__(self):
        self.n = 0

    @rm.endpoint
    async def add(self, k: int) -> int:
        self.n += k
        rm.telemetry.record("tally", n=self.n, k=k)
        return self.n

    @rm.endpoint
    def value(self) -> int:
        return self.n

    @rm.endpoint
    async def relay(self, other, k: int) -> int:
        """A call from this proc to another: worker-to-worker calls and replies get captured too."""
        return await other.add.call_one(k)

    @rm.endpoint
    def flush(self) -> None:
        rm.telemetry.flush()

    @rm.endpoint
    def inbox(self) -> str:
        from rlmesh.actor.client import get_client

        return get_client().inbox_addr

    @rm.endpoint
    def refusals(self) -> int:
        try:
            from rlmesh.transport import refusal_stats
        except ImportError:  # before the replay defences existed: nothing is counted
            return -1
        return sum(c.total for c in refusal_stats().values())
