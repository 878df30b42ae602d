"""A controller run for the observability tests: output, a SIGKILLed proc, a hung proc, restarts.

Prints ``READY <run_id>`` once everything happened, then waits for a line on stdin and exits.
rank 1 restarts twice (SIGKILL by itself, then an injected kill), rank 0 once (hung in a
regex, killed after a heartbeat timeout), rank 2 never.
"""

import sys
import time

import rlmesh as rm
from obs_actors import Talker

N_LINES = 300


def until_back(call, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except rm.ActorDied:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    run_id = rm.telemetry.start_run(config={"scenario": "observe"})
    procs = rm.this_host().spawn_procs(per_host={"procs": 3}, restart=rm.Restart(max_restarts=5), name="workers")
    talkers = procs.spawn("talker", Talker)
    talkers.say.call("hello from every rank").get()
    talkers.slice(procs=2).fail_logged.call_one().get()
    one = talkers.slice(procs=1)
    try:
        one.print_then_sigkill.call_one(N_LINES).get()
    except rm.ActorDied:
        pass
    until_back(lambda: one.say.call_one("back after SIGKILL").get())
    one.say.call_one("last words of rank 1").get()
    _kill("workers.1")
    try:
        talkers.slice(procs=0).stuck_in_regex.call_one().get()
    except rm.ActorDied:
        pass
    until_back(lambda: talkers.slice(procs=0).say.call_one("rank 0 back after hanging").get())
    until_back(lambda: one.say.call_one("rank 1 back again").get())
    rm.telemetry.flush()
    print("READY", run_id, flush=True)
    sys.stdin.readline()


def _kill(proc_id: str) -> None:
    from rlmesh.actor.controller import Controller

    assert Controller.current().inject_fault(proc_id, "kill")


if __name__ == "__main__":
    main()
