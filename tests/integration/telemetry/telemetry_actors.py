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
