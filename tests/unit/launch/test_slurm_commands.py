"""The Slurm launcher's pure parts: its settings, the argv it runs, where ranks go, and what
Slurm's output means for a proc (no cluster: tests/integration/slurm runs a real one)."""

from __future__ import annotations

import signal

import pytest

from rlmesh.errors import ConfigError
from rlmesh.launch.slurm.commands import (JobState, fields_of, gpus_per_task, parse_granted, parse_job, parse_nodes,
                                          place, salloc_argv, srun_argv, step_outcome)
from rlmesh.launch.slurm.config import SlurmConfig

NODE_LINES = (
    "NodeName=rlsn1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 Gres=(null) NodeAddr=10.79.0.11 State=MIXED Partitions=main\n"
    "NodeName=rlsn2 Arch=x86_64 Gres=gpu:a100:4(S:0-1) NodeAddr=10.79.0.12 State=DOWN+NOT_RESPONDING "
    "Reason=Not responding [root@2026-12-06T21:07:51]\n"
    "NodeName=rlsn3 NodeAddr=10.79.0.13 Gres=gpu:8 State=IDLE*\n")
JOB_LINE = ("JobId=2 JobName=rltest JobState=RUNNING Reason=None Dependency=(null) EndTime=Unknown "
            "PreemptEligibleTime=2026-12-06T21:16:19 PreemptTime=None NodeList=rlsn[1,3] BatchHost=rlsn1")


def test_nodes_their_states_and_gpus_from_scontrol():
    a, b, c = parse_nodes(NODE_LINES)
    assert (a.name, a.addr, a.usable, a.gpus) == ("rlsn1", "10.79.0.11", True, 0)
    assert (b.addr, b.usable, b.gpus) == ("10.79.0.12", False, 4)  # down and not responding
    assert (c.usable, c.gpus) == (False, 8)  # '*': slurmctld hears nothing from it
    assert fields_of(NODE_LINES.splitlines()[1])["Reason"] == "Not responding [root@2026-12-06T21:07:51]"


def test_a_job_is_running_ending_or_gone():
    job = parse_job(JOB_LINE)
    assert job is not None and job.nodes == "rlsn[1,3]"  # a Reason= before NodeList= does not swallow it
    assert job.fate("2026-12-06T21:20:00") == JobState.RUNNING
    preempted = parse_job(JOB_LINE.replace("PreemptTime=None", "PreemptTime=2026-12-06T21:16:43"))
    assert preempted is not None and preempted.fate("2026-12-06T21:20:00") == JobState.ENDING
    timed_out = parse_job(JOB_LINE.replace("EndTime=Unknown", "EndTime=2026-12-06T21:19:00"))
    assert timed_out is not None and timed_out.fate("2026-12-06T21:20:00") == JobState.ENDING
    cancelled = parse_job(JOB_LINE.replace("JobState=RUNNING", "JobState=CANCELLED"))
    assert cancelled is not None and cancelled.fate("2026-12-06T21:20:00") == JobState.GONE
    assert parse_job("") is None


def test_salloc_and_srun_argv():
    cfg = SlurmConfig(partition="gpu", account="rl", time="02:00:00", alloc_args=["--qos=high"],
                      srun_args=["--mem-per-cpu=4G"], cpus_per_task=4)
    assert salloc_argv(cfg, 4) == ["salloc", "--no-shell", "--no-kill", "--nodes=4", "--job-name=rlmesh",
                                   "--immediate=120", "--partition=gpu", "--account=rl", "--time=02:00:00",
                                   "--qos=high"]
    argv = srun_argv(cfg, "77", "n3", "rlmesh.gen.1.0", ["python", "-m", "rlmesh.worker"])
    assert argv[:10] == ["srun", "--jobid=77", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n3",
                         "--job-name=rlmesh.gen.1.0", "--kill-on-bad-exit=0", "--input=none", "--quiet"]
    assert argv[10:] == ["--cpus-per-task=4", "--mem-per-cpu=4G", "--", "python", "-m", "rlmesh.worker"]
    # a GPU-bound worker does not overlap: overlapping steps would share the GPUs too
    gpu = srun_argv(cfg, "77", "n3", "rlmesh.gen.1.0", ["python"], gpus=1)
    assert "--overlap" not in gpu and gpu[2] == "--exact" and "--gres=gpu:1" in gpu
    assert parse_granted("salloc: Granted job allocation 123\n") == "123"
    assert parse_granted("salloc: Pending job allocation 124\nsalloc: error: Unable to allocate resources") is None


def test_ranks_to_nodes():
    assert place(5, 3) == [0, 0, 1, 1, 2]  # block: contiguous, the first nodes one more
    assert place(5, 3, "cyclic") == [0, 1, 2, 0, 1]
    assert place(16, 2, per_node=8) == [0] * 8 + [1] * 8  # hosts=2, per_host={"gpus": 8}: 8 tasks per node
    with pytest.raises(ValueError):
        place(1, 0)


def test_gpus_bound_per_task():
    gpu_nodes = parse_nodes("NodeName=a NodeAddr=1.1.1.1 Gres=gpu:8 State=IDLE\nNodeName=b Gres=gpu:8 State=IDLE\n")
    cpu_nodes = parse_nodes("NodeName=a NodeAddr=1.1.1.1 Gres=(null) State=IDLE\n")
    auto = SlurmConfig()
    assert gpus_per_task(auto, {"hosts": 2, "gpus": 8}, gpu_nodes) == 1
    assert gpus_per_task(auto, {"procs": 8}, gpu_nodes) == 0  # no 'gpus' dimension: not a GPU mesh
    assert gpus_per_task(auto, {"gpus": 8}, cpu_nodes) == 0  # no GRES to bind
    assert gpus_per_task(SlurmConfig(gpus_per_task=2), {"procs": 1}, cpu_nodes) == 2


@pytest.mark.parametrize("rc,lines,want", [
    (0, [], (0, None, "")),
    (137, ["srun: error: rlsn1: task 0: Killed"], (None, signal.SIGKILL, "srun: error: rlsn1: task 0: Killed")),
    (1, ["srun: error: Node failure on rlsn2"], (1, None, "node failure")),
    (0, ["slurmstepd: error: *** STEP 5.1 ON rlsn2 CANCELLED AT 2026-12-06T21:16:43 DUE TO PREEMPTION ***"],
     (0, None, "preempted by Slurm")),
    (143, ["slurmstepd: error: *** STEP 5.0 ON rlsn3 CANCELLED AT 2026-12-06T21:16:43 DUE TO TIME LIMIT ***",
           "srun: error: rlsn3: task 0: Terminated"], (None, signal.SIGTERM, "the job's time limit")),
    (3, ["worker says goodbye"], (3, None, "")),
])
def test_what_a_finished_step_means(rc, lines, want):
    assert step_outcome(rc, lines) == want


@pytest.mark.parametrize("bad,key", [
    ({"nodes": -1}, "launcher.nodes"), ({"distribution": "spread"}, "launcher.distribution"),
    ({"time": "two hours"}, "launcher.time"), ({"gpus_per_task": -2}, "launcher.gpus_per_task"),
    ({"job_name": "my job"}, "launcher.job_name"), ({"nodez": 2}, "unknown key(s) ['nodez']"),
])
def test_bad_settings_name_the_key_and_the_fix(bad, key):
    with pytest.raises(ConfigError, match="(use|valid keys)") as err:
        SlurmConfig.from_dict(bad)
    assert key in str(err.value)
