"""Actor classes shared by the runtime's integration tests."""

import asyncio
import os
import signal
import threading
import time

import rlmesh as rm


class Counter(rm.Actor):
    def __init__(self, start: int = 0):
        self.n = start
        self.restarted = False

    @rm.endpoint
    async def incr(self, k: int = 1) -> int:
        self.n += k
        return self.n

    @rm.endpoint
    def value(self) -> int:
        return self.n

    @rm.endpoint
    def where(self) -> dict:
        c = rm.context()
        return {"rank": c.rank, "shape": c.shape, "coords": c.coords, "mesh": c.mesh_name,
                "actor_id": c.actor_id, "pid": c.proc.pid, "real_pid": os.getpid(),
                "incarnation": c.proc.incarnation}

    @rm.endpoint
    async def sleep(self, s: float) -> int:
        await asyncio.sleep(s)
        return rm.context().rank

    @rm.endpoint
    async def in_task(self, wait_s: float = 0.0) -> dict:
        """What an endpoint's first step sees: its own task, a working ``asyncio.timeout``, its actor's
        context; and the same after it waits, if ``wait_s``."""
        first = asyncio.current_task()
        async with asyncio.timeout(5):  # raises outside a task
            if wait_s:
                await asyncio.sleep(wait_s)
        return {"in_task": first is not None, "same_task": first is asyncio.current_task(),
                "rank": rm.context().rank}

    @rm.endpoint
    async def wait_for_file(self, path: str) -> int:
        """Returns (its rank) once ``path`` exists: lets a test choose the order calls complete in."""
        while not os.path.exists(path):
            await asyncio.sleep(0.01)
        return rm.context().rank

    @rm.endpoint
    def block(self, s: float) -> int:
        time.sleep(s)
        return rm.context().rank

    @rm.endpoint
    def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @rm.endpoint
    def bad_result(self):
        return threading.Lock()

    @rm.endpoint
    def echo(self, x):
        return x

    @rm.endpoint
    def freeze_soon(self, delay: float) -> int:
        """SIGSTOP this proc after ``delay`` s: every thread stops, so the heartbeat goes silent."""
        threading.Timer(delay, os.kill, args=(os.getpid(), signal.SIGSTOP)).start()
        return os.getpid()

    @rm.endpoint
    def was_restarted(self) -> bool:
        return self.restarted

    def on_restart(self) -> None:
        self.restarted = True


class Relay(rm.Actor):
    """Calls another mesh it was handed, from its own proc."""

    def __init__(self, target=None):
        self.target = target

    @rm.endpoint
    async def forward_sum(self, target, nbytes: int) -> float:
        import numpy as np

        data = np.ones(nbytes // 8, dtype=np.float64)
        back = await target.echo.call_one(data)
        return float(back.sum())

    @rm.endpoint
    def forward_sync(self, x: int) -> list:
        return self.target.incr.call(x).get(timeout=10).values()

    @rm.endpoint
    def start_sleeps(self, s: float) -> int:
        """One pending ``sleep(s)`` on each of the target's actors, each its own call (to watch them fail)."""
        n = len(self.target)
        self.sleeps = [self.target.slice(procs=r).sleep.call_one(s) for r in range(n)]
        return n

    @rm.endpoint
    def sleep_outcomes(self, timeout: float) -> list:
        """How each pending sleep ended: ``"died"`` (rm.ActorDied), or its error's type name."""
        out = []
        for fut in self.sleeps:
            try:
                fut.get(timeout=timeout)
                out.append("returned")
            except rm.ActorDied:
                out.append("died")
            except Exception as exc:  # noqa: BLE001 - reported to the test, which names what it expected
                out.append(type(exc).__name__)
        return out

    @rm.endpoint
    def kv_put(self, key: str, value) -> None:
        rm.actor.kv.put(key, value)

    @rm.endpoint
    def kv_get(self, key: str, timeout: float):
        return rm.actor.kv.get(key, timeout=timeout)


class BadInit(rm.Actor):
    def __init__(self):
        raise RuntimeError("cannot start: no config")

    @rm.endpoint
    def x(self):
        return 1


class KVAtStop(rm.Actor):
    """In ``on_stop``: reads a key that is there and waits for one that never comes; writes what happened."""

    def __init__(self, out: str):
        self.out = out

    @rm.endpoint
    def ready(self) -> bool:
        return True

    def on_stop(self) -> None:
        import json
        import time

        got = rm.actor.kv.get("atstop/there", timeout=30)
        t0 = time.monotonic()
        try:
            rm.actor.kv.get("atstop/never", timeout=30)
            missing = "found?"
        except KeyError as exc:
            missing = str(exc)
        with open(self.out, "w") as f:
            json.dump({"there": got, "missing": missing, "waited_s": time.monotonic() - t0}, f)


class Blocker(rm.Actor):
    """``hold`` says so in the KV, then never answers: what a buffer looks like to a generator whose
    ``add`` it received just before the run stopped both."""

    @rm.endpoint
    async def hold(self) -> None:
        rm.actor.kv.put("blocker/holding", True)
        await asyncio.Event().wait()


class CallsBlocker(rm.Actor):
    """A sync endpoint blocked on a call to a :class:`Blocker` in another proc (a generator's ``collect``
    waiting on ``buffer.add``); writes how that call ended."""

    def __init__(self, blocker, out: str):
        self.blocker, self.out = blocker, out

    @rm.endpoint
    def call_it(self) -> str:
        try:
            self.blocker.hold.call_one().get()
            how = "answered?"
        except rm.ActorDied as exc:
            how = f"ActorDied: {exc}"
        with open(self.out, "w") as f:
            f.write(how)
        return how


class CleansUp(rm.Actor):
    """``hold`` says it runs (KV ``key``) and waits forever; when it is cancelled it writes so to
    ``out`` (its cleanup), and with ``hang_in_cleanup`` that cleanup then waits forever too."""

    def __init__(self, out: str):
        self.out = out

    @rm.endpoint
    async def hold(self, key: str, hang_in_cleanup: bool = False) -> None:
        rm.actor.kv.put(key, True)  # a key per call: the controller's KV outlives a test's procs
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            with open(self.out, "a") as f:
                f.write("cancelled\n")
            if hang_in_cleanup:
                await asyncio.Event().wait()
            raise
