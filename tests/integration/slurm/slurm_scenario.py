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
    with SlurmCluster(nodes=4, job_name=JOB_NAME) as cluster:
        out["job_owned"] = cluster.launcher.alloc.owned
        procs = cluster.spawn_procs(per_host={"procs": 4}, restart=rm.Restart(max_restarts=5), name="w")
        actors = procs.spawn("where", Where)
        out["hosts"] = [r["host"] for r in actors.where.call().get()]
        out["ready_s"] = time.monotonic() - t0

        def back(rank: int, incarnation: int, what: str, since: float) -> dict:
            one = actors.slice(procs=rank)
            got = wait_for(lambda: (lambda r: r if r["incarnation"] >= incarnation else None)(one.where.call_one().get()),
                           60, what)
            return {**got, "recovery_s": time.monotonic() - since}

        # a killed step: SIGKILL to rank 0's task through Slurm
        t = time.monotonic()
        subprocess.run(["scancel", "--signal=KILL", step_id(cluster.job_id, f"{JOB_NAME}.w.0.0")], check=True)
        out["killed_step"] = back(0, 1, "rank 0 restarted", t)

        # a node set DOWN in Slurm (scontrol): its steps end with srun's "Node failure" and, with --no-kill,
        # the node leaves the job; rank 1 restarts on the usable node with the fewest of the run's steps
        down = out["hosts"][1]
        t = time.monotonic()
        subprocess.run(["scontrol", "update", f"nodename={down}", "state=DOWN", "reason=rlmesh-test"], check=True)
        out["node_down"] = {**back(1, 1, "rank 1 restarted off the DOWN node", t), "node": down}

        # a lost node: every process of rlsn3's namespace (slurmd, slurmstepd, the worker) killed at once
        lost = out["hosts"][2]
        pids = subprocess.run(["ip", "netns", "pids", f"rlslurm-n{lost[-1]}"], capture_output=True, text=True,
                              check=True).stdout.split()
        t = time.monotonic()
        subprocess.run(["kill", "-9", *pids], check=True)
        out["lost_node"] = {**back(2, 1, "rank 2 restarted elsewhere", t), "node": lost}

        # slurmd alone stopped on rlsn4, where ranks 3 and (now) 2 run: a dead host all the same; the old
        # workers, alive and connected, are fenced by the controller once their replacements serve, and exit
        stopped = out["hosts"][3]
        ns = f"rlslurm-n{stopped[-1]}"
        slurmd = subprocess.run(["cat", f"{slurm_dir()}/slurmd-{stopped}.pid"], capture_output=True, text=True,
                                check=True).stdout.strip()
        old_workers = worker_pids(ns)
        t = time.monotonic()
        subprocess.run(["kill", "-9", slurmd], check=True)
        out["slurmd_stopped"] = {**back(3, 1, "rank 3 restarted elsewhere", t), "node": stopped,
                                 "old_workers": len(old_workers)}
        out["slurmd_stopped"]["rank2"] = back(2, 2, "rank 2 restarted again", t)["host"]
        out["slurmd_stopped"]["old_workers_gone"] = bool(wait_for(
            lambda: not (set(worker_pids(ns)) & set(old_workers)) or None, 30, "the old workers to exit"))
        out["all_after"] = [r["host"] for r in actors.where.call().get()]
        out["lost_seen"] = sorted(cluster.launcher.lost)
        job = cluster.job_id
    out["died"] = died
    out["job_left"] = subprocess.run(["squeue", "--noheader", f"--jobs={job}"], capture_output=True,
                                     text=True).stdout.strip()
    return out


def admission() -> dict:
    """A mesh of 100 procs on four nodes of 4000 MB each: refused before the controller or any step
    starts (rlmesh/launch/admission.py)."""
    from rlmesh.actor.controller import Controller
    from rlmesh.errors import ConfigError

    with SlurmCluster(nodes=4, job_name=JOB_NAME) as cluster:
        out: dict = {"nodes": [[n.name, n.cpus, n.memory_mb] for n in cluster.launcher.refresh_nodes() if n.usable],
                     "job": cluster.job_id, "refused": None}
        try:
            cluster.spawn_procs(per_host={"procs": 100}, name="huge")
        except ConfigError as exc:
            out["refused"] = str(exc)
        out["controller_started"] = Controller.current() is not None
        out["steps"] = subprocess.run(["squeue", "--steps", f"--jobs={cluster.job_id}", "--noheader"],
                                      capture_output=True, text=True).stdout.strip()
    return out


if __name__ == "__main__":
    result = {"mesh": mesh, "admission": admission}[sys.argv[1]]()
    print(json.dumps(result), flush=True)
