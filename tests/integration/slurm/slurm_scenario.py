"""Controller programs the Slurm tests run in a fresh interpreter (a controller binds once per
process; this one listens on the cluster's bridge). The last stdout line is a JSON result."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import rlmesh as rm
from rlmesh.actor import hooks
from rlmesh.launch.slurm import SlurmCluster

JOB_NAME = "rlmesh-it"


class Where(rm.Actor):
    """Says which node it runs on and which incarnation of its proc it is."""

    def __init__(self) -> None:
        self.restarted = False

    def on_restart(self) -> None:
        self.restarted = True

    @rm.endpoint
    async def where(self) -> dict:
        return {"host": socket.gethostname(), "incarnation": rm.context().proc.incarnation,
                "restarted": self.restarted}


def step_id(job: str, name: str) -> str:
    out = subprocess.run(["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i %j"],
                         capture_output=True, text=True, check=True).stdout
    return next(line.split()[0] for line in out.splitlines() if line.split()[1:] == [name])


def slurm_dir() -> str:
    return os.path.dirname(os.path.dirname(os.environ["SLURM_CONF"]))


def worker_pids(ns: str) -> list[str]:
    """Pids of rlmesh workers in network namespace ``ns``."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"rlmesh.worker" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = pred()
            if got:
                return got
        except rm.ActorDied:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def mesh() -> dict:
    died: list[dict] = []
    hooks.add_event_sink(lambda ev: died.append({"proc": ev.proc_id, "reason": ev.reason, "signal": ev.signal})
                         if ev.kind == "died" else None)
    out: dict = {}
    t0 = time.monotonic()
    with SlurmCluster(nodes=3, job_name=JOB_NAME) as cluster:
        out["job_owned"] = cluster.launcher.alloc.owned
        procs = cluster.spawn_procs(per_host={"procs": 3}, restart=rm.Restart(max_restarts=5), name="w")
        actors = procs.spawn("where", Where)
        out["hosts"] = [r["host"] for r in actors.where.call().get()]
        out["ready_s"] = time.monotonic() - t0

        # a killed step: SIGKILL to rank 0's task through Slurm
        t1 = time.monotonic()
        subprocess.run(["scancel", "--signal=KILL", step_id(cluster.job_id, f"{JOB_NAME}.w.0.0")], check=True)
        r0 = actors.slice(procs=0)
        back = wait_for(lambda: (lambda r: r if r["incarnation"] == 1 else None)(r0.where.call_one().get()), 60,
                        "rank 0 restarted")
        out["killed_step"] = {**back, "recovery_s": time.monotonic() - t1}

        # a lost node: every process of rlsn3's namespace (slurmd, slurmstepd, the worker) killed at once
        lost = out["hosts"][2]
        pids = subprocess.run(["ip", "netns", "pids", f"rlslurm-n{lost[-1]}"], capture_output=True, text=True,
                              check=True).stdout.split()
        t2 = time.monotonic()
        subprocess.run(["kill", "-9", *pids], check=True)
        r2 = actors.slice(procs=2)
        back = wait_for(lambda: (lambda r: r if r["incarnation"] >= 1 else None)(r2.where.call_one().get()), 60,
                        "rank 2 restarted elsewhere")
        out["lost_node"] = {**back, "node": lost, "recovery_s": time.monotonic() - t2}
        # slurmd alone stopped on rlsn2 (its worker lives on): a dead host all the same; the old worker,
        # still connected, is fenced by the controller once its replacement serves, and exits
        stopped = out["hosts"][1]
        ns = f"rlslurm-n{stopped[-1]}"
        slurmd = subprocess.run(["cat", f"{slurm_dir()}/slurmd-{stopped}.pid"], capture_output=True, text=True,
                                check=True).stdout.strip()
        old_worker = worker_pids(ns)
        t3 = time.monotonic()
        subprocess.run(["kill", "-9", slurmd], check=True)
        r1 = actors.slice(procs=1)
        back = wait_for(lambda: (lambda r: r if r["incarnation"] >= 1 else None)(r1.where.call_one().get()), 60,
                        "rank 1 restarted elsewhere")
        gone = wait_for(lambda: not (set(worker_pids(ns)) & set(old_worker)) or None, 30, "the old worker to exit")
        out["slurmd_stopped"] = {**back, "node": stopped, "recovery_s": time.monotonic() - t3,
                                 "old_worker_seen": bool(old_worker), "old_worker_gone": bool(gone)}
        out["all_after"] = [r["host"] for r in actors.where.call().get()]
        out["lost_seen"] = sorted(cluster.launcher.lost)
        job = cluster.job_id
    out["died"] = died
    out["job_left"] = subprocess.run(["squeue", "--noheader", f"--jobs={job}"], capture_output=True,
                                     text=True).stdout.strip()
    return out


if __name__ == "__main__":
    result = {"mesh": mesh}[sys.argv[1]]()
    print(json.dumps(result), flush=True)
