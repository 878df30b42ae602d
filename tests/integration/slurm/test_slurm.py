"""launcher=slurm on a real Slurm cluster (four slurmd nodes, each in a network namespace of its
own): a mesh of job steps across four nodes, a killed step, a node set DOWN, a lost node and a
node whose slurmd alone stopped recovered, and the
ppo_cartpole recipe run with ``sbatch`` across three nodes: it loses one mid-run and goes on, is
preempted by a higher-priority job, and resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from _support.waiting import wait_for

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(300)  # two recipe runs under sbatch: ~110 s at load 54 on 2 cores


def clean_env(runs_dir: Path) -> dict[str, str]:
    """This test process's environment for a controller of its own: none of the wiring of the
    controller pytest may already run (job id, secret, telemetry address, bind settings)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID", "RLMESH_SECRET", "RLMESH_JOB_ID",
                                "RLMESH_WORKER_PLUGINS", "RLMESH_BIND_HOST", "RLMESH_ADVERTISE_HOST", "SLURM_JOB"))}
    env["RLMESH_RUNS_DIR"] = str(runs_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def squeue(job: str, field: str = "%T") -> str:
    """One field of ``job`` in squeue (its state by default; ``%N`` its nodes, ``%B`` its batch host)."""
    return subprocess.run(["squeue", "--noheader", f"--jobs={job}", f"--format={field}"], capture_output=True,
                          text=True).stdout.strip()


def hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                          check=True).stdout.split()


def netns(node: str) -> str:
    return f"rlslurm-n{node.removeprefix('rlsn')}"


def namespace_pids(ns: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()


def worker_pids(ns: str) -> list[str]:
    """Pids of rlmesh workers in network namespace ``ns``."""
    out = []
    for pid in namespace_pids(ns):
        try:
            if b"rlmesh.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def live_count(run_dir: Path, rows: str, env: dict[str, str]) -> int:
    """``SELECT count(*) FROM {rows}`` on a live run, through its telemetry service (0 when it does not answer)."""
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "sql", str(run_dir), f"SELECT count(*) AS n FROM {rows}",
                          "--format", "json", "--timeout", "20"], capture_output=True, text=True, env=env, timeout=60)
    try:
        return int(json.loads(out.stdout)["rows"][0]["n"])
    except (ValueError, KeyError, IndexError, TypeError):
        return 0


def latest_step(runs_dir: Path) -> int:
    """The step of the run's newest checkpoint (-1 before the first)."""
    return max((int(p.stem.split("_")[1]) for p in runs_dir.glob("2*/checkpoints/step_*.json")), default=-1)


def sbatch(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip().split(";")[0]


def dead_host(reason: str, node: str) -> bool:
    """A death the launcher or Slurm put down to the node: the launcher's probe found it lost, or
    srun said "Node failure". On a very busy machine a proc silent since before the fault may be
    declared dead by its heartbeat's silence first (the same recovery follows), so that counts too."""
    return f"{node} lost" in reason or "node failure" in reason or reason.startswith("heartbeat timeout")


def test_a_mesh_beyond_the_nodes_memory_is_refused_before_any_step(slurm, tmp_path):
    # First in the module: all four nodes are up (the next test takes some down).
    env = {k: v for k, v in clean_env(tmp_path).items() if k != "RLMESH_MAX_PROCS"}
    p = subprocess.run([sys.executable, str(HERE / "slurm_scenario.py"), "admission"], env=env,
                       capture_output=True, text=True, timeout=60)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert p.returncode == 0 and lines, f"scenario failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    r = json.loads(lines[-1])
    assert r["nodes"] == [[f"rlsn{i}", 8, 4000] for i in range(1, 5)]  # scontrol's CPUTot and RealMemory
    assert r["refused"] == (
        f"spawn_procs(per_host={{'procs': 100}}) needs 25.0 GiB of memory for 100 procs at 256 MiB a proc (what a "
        f"recipe proc takes), more than the 15.6 GiB of the 4 usable nodes of Slurm job {r['job']} (scontrol's "
        f"RealMemory); spawn fewer procs, or use more nodes (launcher.nodes, sbatch --nodes), or set "
        f"RLMESH_MAX_PROCS=100 to start them anyway")
    assert not r["controller_started"] and r["steps"] == ""  # refused before the controller or any step


def test_mesh_of_steps_recovers_a_killed_step_and_a_lost_node(slurm, tmp_path):
    p = subprocess.run([sys.executable, str(HERE / "slurm_scenario.py"), "mesh"], env=clean_env(tmp_path),
                       capture_output=True, text=True, timeout=150)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert p.returncode == 0 and lines, f"scenario failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    r = json.loads(lines[-1])
    assert r["job_owned"]  # outside any job the controller asked Slurm for one (salloc --no-shell)
    assert r["hosts"] == ["rlsn1", "rlsn2", "rlsn3", "rlsn4"]  # one proc per node: each its own host and address

    # scancel --signal=KILL of a step: a dead proc with Slurm's words, replaced on its node, on_restart run
    assert r["killed_step"]["host"] == "rlsn1" and r["killed_step"]["restarted"]
    died = [(d["proc"], d["reason"], d["signal"]) for d in r["died"]]
    assert died[0][0] == "w.0" and died[0][2] == 9 and "Killed" in died[0][1], died

    # rlsn2 set DOWN in Slurm: srun's "Node failure" is the death's reason; rank 1 goes to the least
    # loaded usable node (rlsn1, first of three with one step each)
    assert died[1][0] == "w.1" and dead_host(died[1][1], "rlsn2"), died
    assert r["node_down"]["host"] == "rlsn1" and r["node_down"]["restarted"]

    # every process of rlsn3 killed (slurmd, slurmstepd, the worker): a lost host; rank 2 goes to rlsn4
    assert died[2][0] == "w.2" and dead_host(died[2][1], "rlsn3"), died
    assert r["lost_node"]["host"] == "rlsn4" and r["lost_node"]["restarted"]

    # slurmd alone killed on rlsn4: a dead host too; both its procs restart on rlsn1, and the old
    # workers (alive, connected) are fenced by the controller and exit
    assert sorted(d[0] for d in died[3:]) == ["w.2", "w.3"] and all(dead_host(d[1], "rlsn4") for d in died[3:]), died
    assert r["slurmd_stopped"]["host"] == "rlsn1" and r["slurmd_stopped"]["rank2"] == "rlsn1"
    assert r["slurmd_stopped"]["old_workers"] == 2 and r["slurmd_stopped"]["old_workers_gone"]
    assert r["lost_seen"] == ["rlsn3", "rlsn4"] and r["all_after"] == ["rlsn1"] * 4 and len(died) == 5
    assert r["job_left"] in ("", "CG") or "CG" in r["job_left"]  # the allocation it asked for is cancelled
    print(f"\n[slurm] mesh ready {r['ready_s']:.2f}s, killed step back in {r['killed_step']['recovery_s']:.2f}s, "
          f"DOWN node's proc back in {r['node_down']['recovery_s']:.2f}s, lost node's proc back in {r['lost_node']['recovery_s']:.2f}s, slurmd-stopped node's proc back in "
          f"{r['slurmd_stopped']['recovery_s']:.2f}s")
    slurm.node_up("rlsn3")
    slurm.node_up("rlsn4")
    subprocess.run(["scontrol", "update", "nodename=rlsn2", "state=RESUME"], capture_output=True)


def test_recipe_under_sbatch_is_preempted_and_resumes(slurm, tmp_path):
    env = clean_env(tmp_path)
    run = [sys.executable, "-m", "rlmesh.cli", "run"]
    first = sbatch(["--nodes=3", "--no-kill", f"--output={tmp_path}/first.out", "--wrap",
                    " ".join(["exec", *run, "recipe=ppo_cartpole", "launcher=slurm", "trainer.total_steps=200000",
                              "eval.every=100000", "eval.episodes=2"])], env)

    def checkpoint() -> bool:
        return any(tmp_path.glob("2*/checkpoints/step_*.json"))

    wait_for(lambda: checkpoint() or squeue(first) == "", 120, "the first checkpoint")
    assert checkpoint(), (tmp_path / "first.out").read_text()[-4000:]

    # a node of the run lost mid-run: every process of its namespace killed (slurmd and the workers
    # of the run's steps there), not the batch host's, where the controller runs. The run goes on:
    # its procs restart on the nodes left, and it checkpoints a later step.
    batch_host = squeue(first, "%B")
    lost = next(n for n in hostnames(squeue(first, "%N")) if n != batch_host and worker_pids(netns(n)))
    step_at_loss = latest_step(tmp_path)
    subprocess.run(["kill", "-9", *namespace_pids(netns(lost))], check=True)
    run_dir = next(tmp_path.glob("2*/run.json")).parent
    wait_for(lambda: (live_count(run_dir, "actors WHERE event = 'restarted'", env) > 0
                      and latest_step(tmp_path) > step_at_loss) or squeue(first) == "", 180,
             f"the procs of {lost} restarted and a later checkpoint")
    assert latest_step(tmp_path) > step_at_loss, (tmp_path / "first.out").read_text()[-4000:]
    slurm.node_up(lost)
    subprocess.run(["scontrol", "update", f"nodename={lost}", "state=RESUME"], capture_output=True)

    # a job of a higher partition wants every node: Slurm preempts the run (SIGTERM, 30 s grace time)
    urgent = sbatch(["--partition=urgent", "--nodes=3", "--exclusive", f"--output={tmp_path}/urgent.out",
                     "--wrap", "true"], env)
    t0 = time.monotonic()
    wait_for(lambda: squeue(first) == "", 60, "the preempted job to end")
    stopped_s = time.monotonic() - t0
    out = (tmp_path / "first.out").read_text()
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "interrupted", out[-4000:]
    assert "is ending (preempted)" in out, out[-4000:]
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as db:
        trained = db.execute("SELECT sum(samples), max(step) FROM train_steps").fetchone()
        deaths = db.execute("SELECT proc, host, reason FROM actors WHERE event = 'died'").fetchall()
        restarted = db.execute("SELECT count(*) FROM actors WHERE event = 'restarted'").fetchone()[0]
    assert trained[1] >= 1
    lost_procs = [d for d in deaths if d[1] == lost]
    assert lost_procs, (lost, deaths)  # its procs died with the node (the launcher or Slurm says why)
    assert restarted >= len({d[0] for d in lost_procs}), (restarted, deaths)
    assert stopped_s < 30  # within the grace time: the run stopped itself, Slurm did not have to kill it
    wait_for(lambda: squeue(urgent) == "", 60, "the urgent job")

    second = sbatch(["--nodes=3", "--no-kill", f"--output={tmp_path}/second.out", "--wrap",
                     " ".join(["exec", *run, "resume=latest", f"trainer.total_steps={trained[0] + 1000}"])], env)
    wait_for(lambda: squeue(second) == "", 150, "the resumed run")
    out2 = (tmp_path / "second.out").read_text()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok", out2[-4000:]
    assert "resuming run" in out2, out2[-4000:]
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as db:
        after = db.execute("SELECT max(step) FROM train_steps").fetchone()[0]
    assert after > trained[1]  # it trained on from the checkpoint
    print(f"\n[slurm] preempted run stopped {stopped_s:.1f}s after the urgent job's submission, at step "
          f"{trained[1]}; resumed to step {after}")
