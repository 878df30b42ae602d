"""A tour of the rlmesh runtime in one screen: procs, actors, every call verb, peer-to-peer handles, a restart.

    python examples/hello_mesh.py
"""

import asyncio
import os
import signal
import time

import rlmesh as rm


class Scorer(rm.Actor):
    def __init__(self, scale: float = 1.0):
        self.scale = scale
        self.calls = 0

    @rm.endpoint
    async def score(self, text: str) -> float:
        self.calls += 1
        return self.scale * len(text)

    @rm.endpoint
    def whoami(self) -> str:
        ctx = rm.context()
        return f"{ctx.mesh_name}[{ctx.rank}] pid={ctx.proc.pid} incarnation={ctx.proc.incarnation}"


class Judge(rm.Actor):
    """Holds a handle to the scorers and calls them itself: proc to proc, not via the controller."""

    def __init__(self, scorers):
        self.scorers = scorers

    @rm.endpoint
    async def best(self, texts: list[str]) -> str:
        scores = [await self.scorers.score.choose(t) for t in texts]
        return texts[scores.index(max(scores))]


async def main() -> None:
    with rm.this_host().spawn_procs(per_host={"procs": 4}, restart=rm.Restart(max_restarts=3)) as procs:
        scorers = procs.slice(procs=slice(0, 3)).spawn("scorer", Scorer, scale=0.5)
        judge = procs.slice(procs=3).spawn("judge", Judge, scorers)

        print("call     ->", (await scorers.score.call("abcd")).values())
        print("choose   ->", await scorers.score.choose("abcdef"))
        print("call_one ->", await scorers.slice(procs=1).score.call_one("ab"))
        print("stream   ->", [v async for v in scorers.whoami.stream()])
        scorers.score.broadcast("fire and forget")
        print("peer     ->", await judge.best.call_one(["a", "abc", "ab"]))
        print("sync get ->", scorers.slice(procs=0).score.call_one("xyz").get(timeout=10))

        victim = procs.pids[1]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            await scorers.slice(procs=1).score.call_one("too late")
        except rm.ActorDied as err:
            print(f"died     -> {err.mesh}[{err.rank}] signal={err.signal}")
        procs.wait_alive(timeout=30)
        print(f"restart  -> {await scorers.slice(procs=1).whoami.call_one()} "
              f"({time.monotonic() - t0:.2f}s after SIGKILL)")


if __name__ == "__main__":
    asyncio.run(main())
