"""A controller whose actor pauses at breakpoint(): the debugger test attaches to it through a pty.

Prints ``READY <run_id>``; while rank 0 is paused, keeps calling rank 1 (other actors keep
running), then prints ``PINGS <n>`` and ``RESULT <value>`` once rank 0 resumed.
With ``post-mortem`` as argument: rank 0's endpoint raises under ``RLMESH_POST_MORTEM=1``
(set for this mesh only), pauses at the exception, and ``RESULT`` is the error the caller got.
"""

import sys

import rlmesh as rm
from obs_actors import Pauser


def main() -> None:
    post_mortem = sys.argv[1:] == ["post-mortem"]
    run_id = rm.telemetry.start_run()
    env = {"RLMESH_POST_MORTEM": "1"} if post_mortem else None
    procs = rm.this_host().spawn_procs(per_host={"procs": 2}, name="dbgprocs", env=env)
    actors = procs.spawn("dbg", Pauser)
    rank0 = actors.slice(procs=0)
    fut = rank0.divide.call_one(7) if post_mortem else rank0.compute.call_one(41)
    print("READY", run_id, flush=True)
    pings = 0
    other = actors.slice(procs=1)
    while not fut.done():
        assert other.ping.call_one().get(timeout=30) == 1
        pings += 1
    print("PINGS", pings, flush=True)
    try:
        print("RESULT", fut.get(timeout=60), flush=True)
    except rm.ActorError as exc:
        print("RESULT error", type(exc).__name__, str(exc).splitlines()[0], flush=True)


if __name__ == "__main__":
    main()
