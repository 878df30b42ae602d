"""Actors used by the telemetry integration scenario (workers import this by name)."""

import os

import rlmesh as rm


class Recorder(rm.Actor):
    @rm.endpoint
    async def step(self, step: int) -> int:
        c = rm.context()
        rm.telemetry.record("rollouts", reward=float(c.rank) + step / 10, policy_version=step,
                            rollout_id=f"{c.rank}-{step}-{c.proc.incarnation}", length=c.rank + 1)
        return c.rank

    @rm.endpoint
    def mismatch(self) -> str:
        """Same proc, wrong type: the row is refused at the flush, and the SchemaError raised in the caller."""
        rm.telemetry.record("evals", score=0.5)
        rm.telemetry.record("evals", score="high")
        try:
            rm.telemetry.flush()
        except rm.telemetry.SchemaError as exc:
            return str(exc)
        return "no error"

    @rm.endpoint
    def conflict(self, delay: float) -> None:
        """Across procs: rank 0 ships an int first; the others' strings are kept in _rejected."""
        import time

        time.sleep(delay)
        rank = rm.context().rank
        rm.telemetry.record("conflict", value=rank if rank == 0 else f"rank{rank}")
        rm.telemetry.flush()

    @rm.endpoint
    def burst(self, n: int) -> int:
        for i in range(n):
            rm.telemetry.record("burst", i=i)
        return n

    @rm.endpoint
    async def fail(self, msg: str) -> None:
        raise RuntimeError(msg)

    @rm.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @rm.endpoint
    def count_rollouts(self) -> int:
        """A live query from inside a worker, answered by the controller's service."""
        rm.telemetry.flush()
        return rm.telemetry.query("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py()
