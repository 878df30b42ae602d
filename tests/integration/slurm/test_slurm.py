"""launcher=slurm on a real Slurm cluster (three slurmd nodes, each in a network namespace of its
own): a mesh of job steps across the nodes, a killed step, a lost node and a node whose slurmd
alone stopped recovered, and the
ppo_cartpole recipe run with ``sbatch``, preempted by a higher-priority job and resumed."""

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
pytestmark = pytest.mark.timeout(180)


def clean_env(runs_dir: Path) -> dict[str, str]:
    """This test process's environment for a controller of its own: none of the wiring of the
    controller pytest may already run (job id, secret, telemetry address, bind settings)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID", "RLMESH_SECRET", "RLMESH_JOB_ID",
                                "RLMESH_WORKER_PLUGINS", "RLMESH_BIND_HOST", "RLMESH_ADVERTISE_HOST", "SLURM_JOB"))}
    env["RLMESH_RUNS_DIR"] = str(runs_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def squeue(job: str) -> str:
    return subprocess.run(["squeue", "--noheader", f"--jobs={job}", "--format=%T"], capture_output=True,
                          text=True).stdout.strip()


def sbatch(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip().split(";")[0]


def test_mesh_of_steps_recovers_a_killed_step_and_a_lost_node(slurm, tmp_path):
    p = subprocess.run([sys.executable, str(HERE / "slurm_scenario.py"), "mesh"], env=clean_env(tmp_path),
                       capture_output=True, text=True, timeout=150)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert p.returncode == 0 and lines, f"scenario failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    r = json.loads(lines[-1])
    assert r["job_owned"]  # outside any job the controller asked Slurm for one (salloc --no-shell)
    assert r["hosts"] == ["rlsn1", "rlsn2", "rlsn3"]  # one proc per node: each its own host and address

    # scancel --signal=KILL of a step: a dead proc with Slurm's words, replaced on its node, on_restart run
    assert r["killed_step"]["host"] == "rlsn1" and r["killed_step"]["restarted"]
    died = {d["proc"]: d for d in r["died"]}
    assert died["w.0"]["signal"] == 9 and "Killed" in died["w.0"]["reason"], died

    # every process of rlsn3 killed (slurmd, slurmstepd, the worker): a lost host, its proc restarted elsewhere
    assert r["lost_node"]["host"] in ("rlsn1", "rlsn2") and r["lost_node"]["restarted"]
    assert "rlsn3 lost" in died["w.2"]["reason"], died
    # slurmd alone killed on rlsn2: a dead host too; the old worker (alive, connected) is fenced and exits
    assert r["slurmd_stopped"]["host"] == "rlsn1" and r["slurmd_stopped"]["restarted"]
    assert "rlsn2 lost" in died["w.1"]["reason"], died
    assert r["slurmd_stopped"]["old_worker_seen"] and r["slurmd_stopped"]["old_worker_gone"]
    assert r["lost_seen"] == ["rlsn2", "rlsn3"] and r["all_after"] == ["rlsn1"] * 3
    assert r["job_left"] in ("", "CG") or "CG" in r["job_left"]  # the allocation it asked for is cancelled
    print(f"\n[slurm] mesh ready {r['ready_s']:.2f}s, killed step back in {r['killed_step']['recovery_s']:.2f}s, "
          f"lost node's proc back in {r['lost_node']['recovery_s']:.2f}s, slurmd-stopped node's proc back in "
          f"{r['slurmd_stopped']['recovery_s']:.2f}s")
    slurm.node_up("rlsn2")
    slurm.node_up("rlsn3")


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
    # a job of a higher partition wants every node: Slurm preempts the run (SIGTERM, 30 s grace time)
    urgent = sbatch(["--partition=urgent", "--nodes=3", "--exclusive", f"--output={tmp_path}/urgent.out",
                     "--wrap", "true"], env)
    t0 = time.monotonic()
    wait_for(lambda: squeue(first) == "", 60, "the preempted job to end")
    stopped_s = time.monotonic() - t0
    out = (tmp_path / "first.out").read_text()
    run_dir = next(tmp_path.glob("2*/run.json")).parent
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "interrupted", out[-4000:]
    assert "is ending (preempted)" in out, out[-4000:]
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as db:
        trained = db.execute("SELECT sum(samples), max(step) FROM train_steps").fetchone()
    assert trained[1] >= 1
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
