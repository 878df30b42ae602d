"""The admission rule (rlmesh/launch/admission.py): the smaller of what memory and descriptors hold,
unless RLMESH_MAX_PROCS says; a refusal is one line with the setting, the limit and both fixes."""

import psutil
import pytest

from rlmesh.actor.controller import Controller
from rlmesh.launch import local
from rlmesh.errors import ConfigError
from rlmesh.launch.admission import (CONTROLLER_FDS_PER_PROC, PROC_BYTES, admit, admit_spawn, capacity, fds_free,
                                     mem_available)

GiB = 1 << 30


def test_memory_limits_a_host_with_descriptors_to_spare():
    cap = capacity(mem_available=8 * GiB, fds_free=20_000)
    assert cap.procs == 8 * GiB // PROC_BYTES == 32
    assert cap.fits(32) and not cap.fits(33)
    assert cap.limited_by == "8.0 GiB available / 256 MiB a proc"


def test_descriptors_limit_a_controller_with_few_left():
    cap = capacity(mem_available=64 * GiB, fds_free=1000)
    assert cap.procs == 1000 // CONTROLLER_FDS_PER_PROC
    assert cap.limited_by == f"1000 free file descriptors / {CONTROLLER_FDS_PER_PROC} a proc"


def test_the_setting_replaces_the_rule():
    assert capacity(mem_available=1 * GiB, fds_free=10, max_procs=500).procs == 500


def test_a_refusal_names_the_setting_the_limit_and_both_fixes(monkeypatch):
    monkeypatch.setenv("RLMESH_MAX_PROCS", "4")
    admit(4, "generator.replicas=2", "lower generator.replicas")  # fits: nothing raised
    with pytest.raises(ConfigError) as err:
        admit(5, "generator.replicas=3", "lower generator.replicas")
    assert str(err.value) == ("generator.replicas=3 needs 5 procs on this host, which holds 4 now (RLMESH_MAX_PROCS=4); "
                              "lower generator.replicas, or set RLMESH_MAX_PROCS=5 to start them anyway")


def test_spawn_procs_beyond_the_host_is_refused_before_anything_starts(monkeypatch):
    # Direct spawn_procs on this host used to fork until the host ran out; the refusal comes before
    # a controller (its sockets) starts, or any proc or template is forked.
    monkeypatch.delenv("RLMESH_MAX_PROCS", raising=False)
    ctl = Controller.current()  # another test of this process may have started one (and templates)
    procs_before = None if ctl is None else set(ctl.procs)
    before = set(psutil.Process().children(recursive=True))
    huge = capacity(mem_available(), fds_free()).procs + 1
    with pytest.raises(ConfigError) as err:
        local.this_host().spawn_procs(per_host={"procs": huge})  # without the early template
    line = str(err.value)
    assert line.startswith(f"spawn_procs(per_host={{'procs': {huge}}}) needs {huge} procs on this host, which holds ")
    assert f"spawn fewer procs, or set RLMESH_MAX_PROCS={huge} to start them anyway" in line, line
    assert "\n" not in line
    assert set(psutil.Process().children(recursive=True)) <= before  # nothing forked
    assert Controller.current() is ctl and (ctl is None or set(ctl.procs) == procs_before)  # nothing launched


def test_spawn_procs_counts_the_setting_over_the_whole_shape(monkeypatch):
    monkeypatch.setenv("RLMESH_MAX_PROCS", "7")
    admit_spawn({"hosts": 2, "gpus": 3}, running=1)  # 6 + 1 fit: nothing raised
    with pytest.raises(ConfigError) as err:
        admit_spawn({"hosts": 2, "gpus": 3}, running=2)
    assert str(err.value) == ("spawn_procs(per_host={'hosts': 2, 'gpus': 3}) needs 6 procs on this host beside the "
                              "2 of this controller running, which holds 7 now (RLMESH_MAX_PROCS=7); spawn fewer "
                              "procs, or set RLMESH_MAX_PROCS=8 to start them anyway")


def test_a_cluster_refuses_by_pod_slots_then_memory_then_requested_cpu():
    from rlmesh.launch.admission import ClusterCapacity, ProcDemand, cluster_refusal, quantity

    cap = ClusterCapacity(cpus=16, memory=64 * GiB, slots=110, where="the 1 node")
    small, fat = ProcDemand(), ProcDemand(memory=16 * GiB, memory_key="launcher.meshes.gen.memory")
    assert cluster_refusal(110, small, [], cap) is None                       # 27.5 GiB at 256 MiB a proc
    assert cluster_refusal(111, small, [], cap) == "111 pods, more than the 110 pod slots of the 1 node"
    assert cluster_refusal(4, fat, [], cap) is None
    assert cluster_refusal(1, fat, [fat] * 4, cap) == (
        "80.0 GiB of memory for 5 procs (with the 4 of this cluster running) at 16.0 GiB a proc "
        "(launcher.meshes.gen.memory), more than the 64.0 GiB of the 1 node")
    cpu = ProcDemand(cpus=quantity("1500m"), cpu_key="launcher.meshes.gen.cpu")
    assert cluster_refusal(10, cpu, [], cap) is None and "16.5 CPUs" in (cluster_refusal(11, cpu, [], cap) or "")
    assert cluster_refusal(500, small, [], ClusterCapacity(2, 1 * GiB, None, "x"), max_procs=500) is None
    assert quantity("64Gi") == 64 * GiB and quantity("129e6") == 129e6 and quantity("2") == 2


def test_slurm_nodes_carry_their_cpus_and_memory():
    from rlmesh.launch.slurm.commands import parse_nodes

    line = ("NodeName=rlsn1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 CPULoad=0.50 Gres=(null) "
            "NodeAddr=10.77.0.11 RealMemory=4000 AllocMem=0 FreeMem=N/A State=IDLE")
    (node,) = parse_nodes(line)
    assert (node.name, node.addr, node.cpus, node.memory_mb, node.gres) == ("rlsn1", "10.77.0.11", 8, 4000, "")
