"""A controller whose actor pauses at breakpoint(): the debugger test attaches to it through a pty.

Prints ``READY <run_id>``; while rank 0 is paused, keeps calling rank 1 (other actors keep
running), then prints ``PINGS <n>`` and ``RESULT <value>`` once rank 0 resumed.
"""

import rlmesh as rm
from obs_actors import Pauser


def main() -> None:
    run_id = rm.telemetry.start_run()
    procs = rm.this_host().spawn_procs(per_host={"procs": 2}, name="dbgprocs")
    actors = procs.spawn("dbg", Pauser)
    fut = actors.slice(procs=0).compute.call_one(41)
    print("READY", run_id, flush=True)
    pings = 0
    other = actors.slice(procs=1)
    while not fut.done():
        assert other.ping.call_one().get(timeout=30) == 1
        pings += 1
    print("PINGS", pings, flush=True)
    print("RESULT", fut.get(timeout=60), flush=True)


if __name__ == "__main__":
    main()
