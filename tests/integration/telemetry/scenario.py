"""A controller program for the telemetry integration tests (run as a real subprocess).

    python scenario.py full        4 procs, rows from every actor, a failing call, a SIGKILLed
                                   proc that restarts; prints READY <run_id> and waits for a
                                   line on stdin before exiting cleanly.
    python scenario.py no_with     3 procs record 1000 rows each; the program just ends.
    python scenario.py durability  records rows forever (seq, t); the test SIGKILLs it.
    python scenario.py busy        2 procs and the controller record rows in rounds until a line
                                   on stdin; prints READY <run_id>, then ROUNDS <n> at the end.
"""

import os
import select
import signal
import sys
import time

import rlmesh as rm
from telemetry_actors import Recorder


def full() -> None:
    with rm.this_host().spawn_procs(per_host={"procs": 4}, restart=rm.Restart(max_restarts=1)) as procs:
        actors = procs.spawn("recorder", Recorder)
        for step in range(5):
            actors.step.call(step).get()
        rm.telemetry.record("rollouts", reward=42.0, policy_version=99, rollout_id="from-controller")
        try:
            actors.slice(procs=2).fail.call_one("reward collapsed").get()
        except rm.ActorError:
            pass
        victim = actors.slice(procs=3).pid.call_one().get()
        # Wait (on the condition, not a fixed sleep) until proc 3's five rows reached the service: a SIGKILL
        # loses at most the last flush interval, and this scenario checks that what was shipped survives.
        deadline = time.time() + 60
        sql = "SELECT count(*) AS n FROM rollouts WHERE mesh = 'recorder' AND rank = 3"
        while rm.telemetry.query(sql).to_pylist()[0]["n"] < 5 and time.time() < deadline:
            time.sleep(0.1)
        os.kill(victim, signal.SIGKILL)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if actors.slice(procs=3).pid.call_one().get(timeout=5) != victim:
                    break
            except rm.RlmeshError:
                time.sleep(0.2)
        actors.step.call(100).get()
        schema_error = actors.slice(procs=1).mismatch.call_one().get()
        actors.slice(procs=0).conflict.call_one(0.0).get()
        time.sleep(0.5)  # rank 0's int reaches the service first and fixes the column's type
        actors.slice(procs=slice(1, 4)).conflict.call(0.0).get()
        seen_by_worker = actors.slice(procs=0).count_rollouts.call_one().get()
        rm.telemetry.record("scenario", seen_by_worker=seen_by_worker, schema_error=schema_error)
        rm.telemetry.flush()
        print("READY", rm.telemetry.current_run(), flush=True)
        sys.stdin.readline()


def no_with() -> None:
    """Exit with procs still up (no `with`, no stop): the runtime is stopped at exit, rows kept."""
    procs = rm.this_host().spawn_procs(per_host={"procs": 3})
    procs.spawn("recorder", Recorder).burst.call(1000).get()
    print("EXITING", rm.telemetry.current_run(), flush=True)


def durability() -> None:
    seq = 0
    started = False
    while True:
        rm.telemetry.record("ticks", seq=seq, t=time.time())
        seq += 1
        if not started and seq == 100:
            print("RECORDING", rm.telemetry.current_run(), flush=True)
            started = True
        time.sleep(0.001)


def busy() -> None:
    """Rows from two worker procs and the controller, round after round, while the test queries the run."""
    rounds = 0
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        actors = procs.spawn("recorder", Recorder)
        actors.burst.call(1).get()  # the procs are up and recording
        print("READY", rm.telemetry.current_run(), flush=True)
        while not select.select([sys.stdin], [], [], 0)[0]:
            actors.burst.call(100).get()
            rounds += 1
            rm.telemetry.record("ticks", seq=rounds)
            time.sleep(0.02)
    print("ROUNDS", rounds, flush=True)


if __name__ == "__main__":
    {"full": full, "durability": durability, "no_with": no_with, "busy": busy}[sys.argv[1]]()
