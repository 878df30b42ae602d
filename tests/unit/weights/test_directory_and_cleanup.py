"""Directory seam and crash cleanup logic (the controller plugin's sink), without processes."""

import os

import pytest

from rlmesh.actor.pids import pid_running
from rlmesh.actor.hooks import ProcEvent
from rlmesh.weights import plugin, slots
from rlmesh.weights.directory import FileDirectory, KVDirectory, safe


def test_file_directory_put_get_keys_delete(tmp_path):
    d = FileDirectory(tmp_path)
    d.put("rlmesh/weights/policy", {"pid": 1})
    d.put("rlmesh/weights/value", {"pid": 2})
    d.put("other/x", 1)
    assert d.get("rlmesh/weights/policy", 0) == {"pid": 1}
    assert d.keys("rlmesh/weights/") == ["rlmesh/weights/policy", "rlmesh/weights/value"]
    d.delete("rlmesh/weights/policy")
    with pytest.raises(KeyError):
        d.get("rlmesh/weights/policy", 0.05)


def test_kv_directory_uses_the_runtime_store():
    from rlmesh.actor import kv

    KVDirectory().put("rlmesh/weights/t-kv", {"a": 1})
    assert kv.get("rlmesh/weights/t-kv", 0) == {"a": 1}
    kv.delete("rlmesh/weights/t-kv")


def test_safe_names_have_no_separators():
    assert safe("trainer-0/rank 1") == "trainer_0_rank_1"
    assert "-" not in safe("a-b-c")


def _touch(d, name):
    p = d / name
    p.write_bytes(b"x")
    return p


def test_sink_unlinks_only_the_dead_procs_segments(tmp_path, monkeypatch):
    monkeypatch.setenv("RLMESH_SHM_DIR", str(tmp_path))
    dead = _touch(tmp_path, f"{slots.base_name('job1', 'trainer_0', 4242, 'policy')}-s0")
    dead_ctl = _touch(tmp_path, f"{slots.base_name('job1', 'trainer_0', 4242, 'policy')}.ctl")
    other_proc = _touch(tmp_path, f"{slots.base_name('job1', 'gen_0', 4343, 'policy')}-s0")
    other_job = _touch(tmp_path, f"{slots.base_name('job2', 'trainer_0', 4242, 'policy')}-s0")
    sink = plugin.make_sink("job1", "hostA")
    ev = dict(proc_mesh="m", rank=0, proc_id="trainer_0", pid=4242, host="hostA", incarnation=0)
    sink(ProcEvent(kind="spawned", **ev))
    assert dead.exists()
    sink(ProcEvent(kind="died", **{**ev, "host": "hostB"}))  # another host's /dev/shm is not ours
    assert dead.exists()
    sink(ProcEvent(kind="died", **ev))
    assert not dead.exists() and not dead_ctl.exists()
    assert other_proc.exists() and other_job.exists()


def test_unknown_pid_spares_live_incarnations(tmp_path, monkeypatch):
    monkeypatch.setenv("RLMESH_SHM_DIR", str(tmp_path))
    live = _touch(tmp_path, f"{slots.base_name('j', 'p', os.getpid(), 'w')}-s0")
    gone = _touch(tmp_path, f"{slots.base_name('j', 'p', 2**22 + 12345, 'w')}-s0")
    removed = slots.cleanup_segments("j", "p", None)
    assert removed == [str(gone)] and live.exists()


def test_job_sweep_removes_the_jobs_dead_and_own_segments_and_spares_another_live_process(tmp_path, monkeypatch):
    """A controller's exit sweeps its job: dead owners' segments and its own go. A live process of
    the same job id (another controller: a child ``rlmesh run`` inherits ``RLMESH_JOB_ID``) keeps its
    own, which the sweep once unlinked (a test suite's subprocess runs took the parent's heartbeat board)."""
    import subprocess
    import sys

    monkeypatch.setenv("RLMESH_SHM_DIR", str(tmp_path))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        a = _touch(tmp_path, f"{slots.base_name('j', 'p', 2**22 + 12345, 'w')}-s0")
        b = _touch(tmp_path, f"{slots.base_name('j', 'q', 2**22 + 12346, 'w')}.ctl")
        own = _touch(tmp_path, f"{slots.base_name('j', 'controller', os.getpid(), 'heartbeats')}")
        theirs = _touch(tmp_path, f"{slots.base_name('j', 'controller', other.pid, 'heartbeats')}")
        keep = _touch(tmp_path, "unrelated")
        assert sorted(slots.cleanup_segments("j")) == sorted([str(a), str(b), str(own)])
        assert keep.exists() and theirs.exists()
    finally:
        other.kill()
        other.wait()
    assert slots.cleanup_segments("j") == [str(theirs)]  # once its owner is gone


def test_reclaim_takes_dead_owners_segments_of_any_job_and_spares_live_ones(tmp_path, monkeypatch, capsys):
    """Issue 11 item 8: a run killed outright (controller too) left its slots and .ctl forever."""
    import subprocess
    import sys

    from rlmesh.weights.clean import clean_main

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; left unreaped until wait(): a zombie
    gone = 2**22 + 12345
    dead = [_touch(tmp_path, f"{slots.base_name(job, 'rl.1', gone, 'policy')}-tok{sfx}")
            for job in ("jobA", "jobB") for sfx in ("-s0", "-s1", ".ctl", ".ctl.99.tmp")]
    live = _touch(tmp_path, f"{slots.base_name('jobA', 'rl.2', os.getpid(), 'policy')}-tok-s0")
    keep = _touch(tmp_path, "rlmesh-w-not-a-pid-name")
    import time

    deadline = time.monotonic() + 30
    while pid_running(zombie.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    undead = _touch(tmp_path, f"{slots.base_name('jobC', 'rl.1', zombie.pid, 'policy')}-tok.ctl")
    monkeypatch.setenv("RLMESH_RUNS_DIR", str(tmp_path / "runs"))
    assert clean_main(["--shm-dir", str(tmp_path)]) == 0
    assert "removed 9 shared-memory segment(s)" in capsys.readouterr().out
    assert not any(p.exists() for p in [*dead, undead])
    assert live.exists() and keep.exists()
    zombie.wait()


def test_reclaim_sees_through_a_reused_pid(tmp_path):
    """A live pid that started after the segment was last written is not its creator."""
    stale = _touch(tmp_path, f"{slots.base_name('jobR', 'rl.1', os.getpid(), 'policy')}-tok-s0")
    os.utime(stale, (1_000_000, 1_000_000))        # written in 1970: long before this process started
    fresh = _touch(tmp_path, f"{slots.base_name('jobR', 'rl.1', os.getpid(), 'policy')}-tok.ctl")
    assert slots.reclaim_dead_segments(str(tmp_path)) == [str(stale)]
    assert fresh.exists()
