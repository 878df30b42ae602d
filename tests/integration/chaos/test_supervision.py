"""Supervision at any moment, with real procs: a death while a proc starts or while its actors
are created is recovered like any other; a killed controller takes every worker with it at once
(nothing written after); a proc killed for a silent heartbeat is reaped; the restart budget is an
intensity (N within T seconds), so spaced faults are survived and a crash loop is not."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import rlmesh as rm
from rlmesh.actor import hooks
from rlmesh.actor.controller import Controller
from rlmesh.rl.run.resilience import Recovery, RunFailed
from _support.waiting import wait_for
from chaos_actors import Counter, SlowInit, StuckUntilKilled

pytestmark = pytest.mark.timeout(120)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


@pytest.fixture
def events():
    got: list[hooks.ProcEvent] = []
    hooks.add_event_sink(got.append)
    yield got
    hooks.remove_event_sink(got.append)


def zombie_or_running(pid: int) -> bool:
    try:
        psutil.Process(pid)
        return True
    except psutil.NoSuchProcess:
        return False


def test_a_proc_killed_inside_actor_init_is_replaced_and_the_spawn_succeeds(tmp_path, events):
    """Before: ``ActorDied: slow[1].__init__`` reached the spawn caller and ended the program."""
    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=3)) as procs:
        victim = procs.pids[1]
        killed = threading.Event()

        def kill_inside_init() -> None:
            deadline = time.monotonic() + 60
            while not (tmp_path / f"init-{victim}").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(victim, signal.SIGKILL)  # __init__ has started and sleeps: a death during construction
            killed.set()

        threading.Thread(target=kill_inside_init, daemon=True).start()
        mesh = procs.spawn("slow", SlowInit, str(tmp_path), 5.0)  # long enough for the killer on a busy host
        assert killed.is_set()
        assert mesh.slice(procs=1).incarnation.call_one().get(timeout=30) == 1
        assert mesh.slice(procs=0).incarnation.call_one().get(timeout=30) == 0
        assert mesh.slice(procs=1).pid.call_one().get(timeout=30) == procs.pids[1] != victim
        kinds = [e.kind for e in events if e.proc_mesh == procs.name and e.rank == 1]
        assert kinds[:2] == ["spawned", "died"] and "restarted" in kinds, kinds
        assert any(e.kind == "died" and e.pid == victim and e.signal == signal.SIGKILL for e in events)


def test_a_proc_killed_before_it_joined_is_replaced_and_the_launch_succeeds(events, monkeypatch):
    """A SIGKILL while the interpreter still starts (imports) is a death like any other."""
    monkeypatch.setenv("RLMESH_FORKSERVER", "0")  # a fresh interpreter: procs forked warm skip the imports
    name = "early"
    hit: list[int] = []

    def kill_while_starting() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            c = Controller.current()
            rec = c.procs.get(f"{name}.0") if c is not None else None
            if rec is not None and rec.state == "starting" and rec.incarnation == 0 and rec.pid:
                os.kill(rec.pid, signal.SIGKILL)
                hit.append(rec.pid)
                return
            time.sleep(0.005)

    Controller.get()  # the killer thread looks the record up on the running controller
    threading.Thread(target=kill_while_starting, daemon=True).start()
    with rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=2), name=name) as procs:
        assert hit, "the proc joined before it could be killed"
        assert procs.incarnations() == [1] and procs.states() == ["alive"]
        assert procs.spawn("after", Counter).incr.call_one().get(timeout=30) == 1


def test_a_proc_that_cannot_start_is_not_retried():
    """Exiting by itself before it ever joined (a broken interpreter): a restart would do the same."""
    t0 = time.monotonic()
    with pytest.raises(rm.ActorDied, match=r"ended before it joined \(exit code 1\)"):
        rm.this_host(python="/bin/false").spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=-1),
                                                       name="broken")
    assert time.monotonic() - t0 < 30


CONTROLLER = """
import json, os, signal, sys, time
import rlmesh as rm
from chaos_actors import Scribbler

host = rm.this_host()
procs = host.spawn_procs(per_host={{"procs": 2}}, restart=rm.Restart(max_restarts=3), name="scrib")
s = procs.spawn("scribbler", Scribbler, {path!r})
first = s.pid.call().get(timeout=60)
assert host.launcher.wait_fork_server("scrib", 120)
os.kill(first[1], signal.SIGKILL)          # rank 1 comes back forked from the warm template
while procs.incarnations()[1] == 0:
    time.sleep(0.01)
procs.wait_alive(120)
pids = s.pid.call().get(timeout=60)
print(json.dumps({{"workers": list(pids), "fork_server": host.launcher.fork_server_pid("scrib")}}), flush=True)
time.sleep(600)
"""


def test_a_killed_controller_takes_every_worker_with_it_at_once_and_nothing_is_written_after(tmp_path):
    """Before: workers got SIGTERM, ran ``on_stop`` (a trainer saves a checkpoint there) and lived on."""
    log = tmp_path / "scribble.log"
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER.format(path=str(log)))
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE)])
    ctl = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = ctl.stdout.readline()
        assert line, "the controller script ended early"
        info = json.loads(line)
        pids = [*info["workers"], info["fork_server"]]
        assert info["workers"][1] in [c.pid for c in psutil.Process(info["fork_server"]).children()]
        os.kill(ctl.pid, signal.SIGKILL)
        t_kill = time.time()
        ctl.wait(10)
        wait_for(lambda: not any(zombie_or_running(p) for p in pids), timeout=2.0,
                 what="every worker and the fork server gone after the controller's SIGKILL")
        gone_after = time.time() - t_kill
    finally:
        if ctl.poll() is None:
            ctl.kill()
        ctl.stdout.close()
    lines = log.read_text().splitlines()
    assert not [x for x in lines if " on_stop " in x], "on_stop ran after the controller died"
    late = [x for x in lines if float(x.split()[0]) > t_kill + 0.2]
    assert not late, f"written {len(late)} times after the controller died (all gone after {gone_after:.2f}s)"


def test_a_proc_killed_for_a_silent_heartbeat_is_reaped_not_left_a_zombie(events):
    host = rm.this_host()
    with host.spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=2), name="zomb") as procs:
        c = procs.spawn("frozen", Counter)
        assert host.launcher.wait_fork_server("zomb", 120)  # the replacement is forked: no Popen reaps for us
        old = procs.pids[0]
        os.kill(old, signal.SIGSTOP)
        wait_for(lambda: any(e.kind == "died" and e.pid == old for e in events), timeout=30.0, what="the stopped proc declared dead")
        died = next(e for e in events if e.kind == "died" and e.pid == old)
        assert "stopped" in died.reason and "heartbeat" in died.reason, died.reason
        wait_for(lambda: not zombie_or_running(old), timeout=5.0, what="the killed proc reaped")
        procs.wait_alive(60)
        assert c.incr.call_one().get(timeout=30) == 1


def test_restart_budget_is_an_intensity_spaced_faults_survive_a_crash_loop_stops(events):
    """``Restart(max_restarts=1, within_s=W)``: one restart per W seconds. A lifetime budget of 1
    would give up at the second kill; the window forgives it once W has passed."""
    window = 6.0
    host = rm.this_host()
    with host.spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=1, within_s=window),
                          name="budget") as procs:
        c = procs.spawn("tough", Counter)
        assert host.launcher.wait_fork_server("budget", 120)  # restarts in ~0.1 s, well inside the window

        def kill_and_wait_death() -> float:
            pid, n = procs.pids[0], len([e for e in events if e.kind == "died" and e.proc_mesh == "budget"])
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: len([e for e in events if e.kind == "died" and e.proc_mesh == "budget"]) > n, 30.0,
                     "the killed proc declared dead")
            return time.monotonic()

        first = kill_and_wait_death()
        procs.wait_alive(60)
        time.sleep(max(0.0, first + window + 0.3 - time.monotonic()))  # the window slides past the first restart
        kill_and_wait_death()
        procs.wait_alive(60)  # a lifetime budget of 1 would have given up here
        assert c.incr.call_one().get(timeout=30) == 1
        kill_and_wait_death()  # a second death within the window: a crash loop, stop
        wait_for(lambda: any(e.kind == "gave_up" and e.proc_mesh == "budget" for e in events), timeout=10,
                 what="the supervisor giving up")
        assert procs.states() == ["failed"]
        gave_up = next(e for e in events if e.kind == "gave_up" and e.proc_mesh == "budget")
        assert f"within {window:g} s" in gave_up.reason, gave_up.reason


@pytest.mark.parametrize("restarts", [1, 0])
def test_a_call_the_run_cannot_go_on_without_survives_its_proc_being_killed_mid_call(tmp_path, restarts):
    """What a recipe does for the trainer's state at its start (``Recovery.call_surviving``): the
    proc killed while the call is in flight is replaced and the call made again on the replacement;
    with no restart left it is a :class:`RunFailed` naming the budget, not a hang or a bare ActorDied."""
    import asyncio

    with rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=restarts),
                                    name=f"surv{restarts}") as procs:
        mesh = procs.spawn("stuck", StuckUntilKilled, str(tmp_path))
        first = procs.pids[0]

        async def call_and_kill() -> int:
            call = asyncio.ensure_future(Recovery(timeout_s=90).call_surviving(mesh, "trainer", mesh.state.call_one))
            while not (tmp_path / f"state-{first}").exists():  # the call is in flight, inside the endpoint
                assert not call.done(), call
                await asyncio.sleep(0.02)
            os.kill(first, signal.SIGKILL)
            return await asyncio.wait_for(call, 90)

        if restarts:
            assert asyncio.run(call_and_kill()) == 1  # answered by the replacement
            assert procs.pids[0] != first
        else:
            with pytest.raises(RunFailed, match="restarts are used up"):
                asyncio.run(call_and_kill())


def test_ctrl_c_reaching_the_workers_is_left_to_the_controller(tmp_path, events):
    """Ctrl-C in a terminal signals every process of the group; on a busy machine the workers can see
    it before the controller does. Before: each worker exited 130 on its own, was recorded ``died`` and
    restarted in the middle of the controller's stop (and used up restart budget). Now a worker
    ignores SIGINT, keeps serving, and stops only when its controller stops it."""
    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=3),
                                    name="ctrlc") as procs:
        mesh = procs.spawn("sigint", SlowInit, str(tmp_path), 0.0)
        pids = list(procs.pids)
        sent = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGINT)
        for rank, pid in enumerate(pids):  # each answers after the signal reached it, from the same process
            assert mesh.slice(procs=rank).pid.call_one().get(timeout=30) == pid
        time.sleep(max(0.0, sent + 1.0 - time.monotonic()))  # a worker that exits on SIGINT has by now
        assert procs.states() == ["alive", "alive"] and list(procs.pids) == pids
        assert not [e for e in events if e.proc_mesh == "ctrlc" and e.kind == "died"], events
    stopped = [e for e in events if e.proc_mesh == "ctrlc" and e.kind == "stopped"]
    assert sorted(e.pid for e in stopped) == sorted(pids)
