"""The supervision policies as pure logic: the restart intensity window, the adaptive heartbeat
allowance, the OS state of a pid, and timeouts named by the key that sets them."""

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from rlmesh.actor.supervision import (
    GAP_MARGIN, GAP_WINDOW_S, FailureDetection, HeartbeatMonitor, HostGaps, OsState, Restart, os_state, silent_death)


def test_restart_is_an_intensity_within_a_window():
    r = Restart(max_restarts=2, within_s=10.0)
    assert r.allows([], 0.0) and r.allows([0.0], 1.0)
    assert not r.allows([0.0, 1.0], 2.0)                 # a crash loop: two within 10 s
    assert r.allows([0.0, 1.0], 10.5)                    # the first has left the window
    assert r.allows([0.0] * 100 + [50.0], 55.0)          # a trickle survives any number over time


def test_restart_keeps_its_old_meanings():
    assert not Restart().allows([], 0.0) and not Restart().restartable   # 0: never
    assert Restart(max_restarts=-1).allows([0.0] * 1000, 0.0)            # -1: forever
    lifetime = Restart(max_restarts=3)                                    # no window: a lifetime count
    assert lifetime.allows([0.0, 1e6], 2e6) and not lifetime.allows([0.0, 1.0, 1e6], 2e6)
    assert lifetime.allows(2) and not lifetime.allows(3)
    with pytest.raises(ValueError, match="max_restarts"):
        Restart(max_restarts=-2)
    with pytest.raises(ValueError, match="within_s"):
        Restart(max_restarts=1, within_s=0)
    assert "within 30 s" in Restart(max_restarts=10, within_s=30).describe()


def test_heartbeat_allowance_is_the_floor_on_a_steady_host_and_grows_with_observed_delays():
    steady = HeartbeatMonitor()
    for i in range(100):
        steady.beat(i * 0.2)
    assert steady.allowance(1.5, 8.0) == 1.5
    busy = HeartbeatMonitor()
    t = 0.0
    for i in range(100):
        t += 3.0 if i % 20 == 0 else 0.2                # a 3 s stall now and then (a starved host)
        busy.beat(t)
    assert busy.allowance(1.5, 8.0) >= 6.0               # twice the longest gap seen
    fresh = HeartbeatMonitor()
    fresh.beat(0.0)
    assert fresh.allowance(2.5, 8.0) == 2.5              # too few samples: the floor


def test_a_proc_is_allowed_what_its_hosts_gaps_show_for_a_minute_then_the_floor_again():
    host = HostGaps()
    starved, fresh = HeartbeatMonitor(), HeartbeatMonitor()
    starved.host = fresh.host = host
    t = 100.0
    for _ in range(10):                                  # a neighbour's beats lag 1.2 s (a busy host)
        t += 1.2
        starved.beat(t)
    fresh.beat(t)                                        # a replacement that has beaten once
    assert fresh.allowance(1.5, 8.0, t) == pytest.approx(GAP_MARGIN * 1.2)
    later = t + GAP_WINDOW_S + 2                         # a quiet minute since: back to the floor
    assert fresh.allowance(1.5, 8.0, later) == 1.5
    alone = HeartbeatMonitor()                           # no host: its own gaps only
    alone.beat(0.0)
    assert alone.allowance(1.5, 8.0, 0.0) == 1.5


def test_a_hang_is_judged_by_the_gaps_seen_not_the_hosts_load_average():
    hb = HeartbeatMonitor()
    hb.host = HostGaps()
    for i in range(50):
        hb.beat(i * 0.2)                                 # live beats lag at most 0.2 s: whatever the load
    rec = SimpleNamespace(detect=FailureDetection(), last_hb=hb.last, hb=hb, handle=None, spawns_pending=0)
    assert silent_death(rec, hb.last + 1.4) is None                  # within the 1.5 s floor
    why = silent_death(rec, hb.last + 1.6)
    assert why is not None and "beyond the 1.5s" in why and "RLMESH_HEARTBEAT_TIMEOUT_S=1.5" in why
    assert silent_death(rec, hb.last + 1.6, together=3) is None      # several silent at once: twice as long
    hb.host.add(hb.last, 2.0)                            # a 2 s gap elsewhere on the host
    assert silent_death(rec, hb.last + 3.9) is None and silent_death(rec, hb.last + 4.1) is not None


def test_restart_of_an_incarnation_keeps_the_delay_history_but_not_the_gap():
    hb = HeartbeatMonitor()
    for i in range(10):
        hb.beat(i * 0.2)
    n = len(hb.intervals)
    hb.restart(100.0)                                    # the replacement joined: no 98 s "interval"
    hb.beat(100.2)
    assert len(hb.intervals) == n + 1 and max(hb.intervals) < 1.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_os_state_tells_stopped_from_running_from_gone():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os_state(p.pid) is OsState.RUNNING
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while os_state(p.pid) is not OsState.STOPPED:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(p.pid, signal.SIGKILL)
        while os_state(p.pid) is not OsState.GONE:       # a zombie counts as gone
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        p.kill()
        p.wait()
    assert os_state(p.pid) is OsState.GONE and os_state(None) is OsState.UNKNOWN


def test_timeouts_are_named_by_the_key_that_sets_them(monkeypatch):
    assert FailureDetection(key_prefix="run.").key("start_timeout_s") == "run.start_timeout_s"
    assert FailureDetection().key("heartbeat_timeout_s") == "RLMESH_HEARTBEAT_TIMEOUT_S"
    with pytest.raises(ValueError, match="run.heartbeat_timeout_s"):
        FailureDetection(heartbeat_timeout_s=0, key_prefix="run.")
    monkeypatch.setenv("RLMESH_HEARTBEAT_TIMEOUT_S", "4")
    monkeypatch.setenv("RLMESH_INIT_HEARTBEAT_TIMEOUT_S", "2")
    d = FailureDetection.from_env()
    assert d.heartbeat_timeout_s == 4 and d.init_heartbeat_timeout_s == 4


def test_run_config_builds_the_mesh_policy():
    from rlmesh.recipes.recipe_config import RunConfig

    policy = RunConfig(max_restarts=5, restart_window_s=20.0, start_timeout_s=99.0).restart_policy()
    assert (policy.max_restarts, policy.within_s) == (5, 20.0)
    assert policy.detection.start_timeout_s == 99.0 and policy.detection.key("start_timeout_s") == "run.start_timeout_s"
    with pytest.raises(Exception, match="run.restart_window_s"):
        RunConfig(restart_window_s=-1.0)
