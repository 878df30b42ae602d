"""Death detection, futures failing instead of hanging, and restarts — with real SIGKILL/SIGSTOP."""

import os
import signal
import time

import pytest

import rlmesh as rm
from rlmesh.actor import hooks
from _support.waiting import wait_for
from runtime_actors import BadInit, Counter

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def events():
    got: list[hooks.ProcEvent] = []
    hooks.add_event_sink(got.append)
    yield got
    hooks.remove_event_sink(got.append)


def test_sigkill_fails_pending_and_later_calls(events):
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        c = procs.spawn("victim", Counter)
        pending = c.slice(procs=1).sleep.call_one(30)
        time.sleep(0.2)
        t0 = time.monotonic()
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(rm.ActorDied) as ei:
            pending.get(timeout=10)
        assert time.monotonic() - t0 < 2.0, "death must be noticed within 2 s"
        assert ei.value.signal == signal.SIGKILL and ei.value.rank == 1 and ei.value.mesh == "victim"
        with pytest.raises(rm.ActorDied):
            c.slice(procs=1).value.call_one().get(timeout=5)
        with pytest.raises(rm.ActorDied):
            c.value.call().get(timeout=5)  # a mesh-wide call fails if any member is dead
        assert c.slice(procs=0).incr.call_one().get(timeout=5) == 1  # the survivor serves on
        died = [e for e in events if e.kind == "died" and e.proc_mesh == procs.name]
        assert died and died[0].signal == signal.SIGKILL and died[0].rank == 1
        assert died[0].actors == ("victim/1",)


def test_restart_recreates_actors_and_runs_on_restart(events):
    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=1)) as procs:
        c = procs.spawn("phoenix", Counter, start=7)
        c.incr.call(5).get(timeout=10)
        old_pid = procs.pids[0]
        pending = c.slice(procs=0).sleep.call_one(30)
        os.kill(old_pid, signal.SIGKILL)
        with pytest.raises(rm.ActorDied):
            pending.get(timeout=10)
        procs.wait_alive(timeout=20)
        assert procs.pids[0] != old_pid
        one = c.slice(procs=0)
        info = one.where.call_one().get(timeout=10)
        assert info["incarnation"] == 1 and info["real_pid"] == procs.pids[0]
        assert one.value.call_one().get(timeout=10) == 7  # __init__ ran again with its original args
        assert one.was_restarted.call_one().get(timeout=10) is True
        assert c.slice(procs=1).was_restarted.call_one().get(timeout=10) is False
        kinds = [e.kind for e in events if e.proc_mesh == procs.name and e.rank == 0]
        assert kinds[:4] == ["spawned", "died", "spawned", "restarted"]
        # the restart budget is spent: the next death is final
        os.kill(procs.pids[0], signal.SIGKILL)
        wait_for(lambda: any(e.kind == "gave_up" and e.proc_mesh == procs.name for e in events), 10.0, "gave_up")
        with pytest.raises(rm.ActorDied):
            one.value.call_one().get(timeout=5)


def test_peer_calls_fail_when_their_target_dies():
    from runtime_actors import Relay

    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        target = procs.slice(procs=1).spawn("target", Counter)
        relay = procs.slice(procs=0).spawn("relay", Relay, target)
        fut = relay.forward_sync.call_one(1)
        assert fut.get(timeout=10) == [1]
        os.kill(procs.pids[1], signal.SIGKILL)
        time.sleep(0.1)
        with pytest.raises(rm.ActorError, match="died"):
            relay.forward_sync.call_one(1).get(timeout=10)


def test_procs_killed_together_fail_a_peers_calls_on_each_of_them():
    """Deaths seen in one supervisor turn reach the survivors in one message (not one per death per
    survivor, which was O(N^2) when N procs stop together): every death in it must still count."""
    from runtime_actors import Relay

    with rm.this_host().spawn_procs(per_host={"procs": 4}) as procs:
        targets = procs.slice(procs=slice(1, 4)).spawn("targets", Counter)
        relay = procs.slice(procs=0).spawn("relay", Relay, targets)
        assert relay.start_sleeps.call_one(60).get(timeout=10) == 3
        for pid in procs.pids[1:]:
            os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        assert relay.sleep_outcomes.call_one(30).get(timeout=40) == ["died"] * 3
        assert time.monotonic() - t < 20, "the peer learnt of the deaths only by a timeout"


def test_hung_proc_is_declared_dead_by_heartbeat(events):
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = procs.spawn("frozen", Counter)
        pid = c.freeze_soon.call_one(0.2).get(timeout=10)
        pending = c.sleep.call_one(30)
        t0 = time.monotonic()
        with pytest.raises(rm.ActorDied, match="heartbeat"):
            pending.get(timeout=15)
        assert time.monotonic() - t0 < 4.0
        assert pid == procs.pids[0]
        assert any(e.kind == "died" and "heartbeat" in e.reason for e in events if e.proc_mesh == procs.name)


def test_a_running_silent_proc_is_allowed_what_its_hosts_heartbeat_gaps_show(events):
    """A hang that is no stop (the proc runs, its beats stop): the procs of one host pool their
    heartbeat gaps, and the silence allowed is what those gaps (and its own) make plausible, from
    the floor up, not the floor times the host's load average."""
    import re

    from rlmesh.actor.controller import Controller
    from rlmesh.actor.supervision import GAP_MARGIN

    with rm.this_host().spawn_procs(per_host={"procs": 2}, name="gapped") as procs:
        ctl = Controller.get()
        a, b = (ctl.procs[p] for p in procs.proc_ids)
        host = a.hb.host
        assert host is not None and b.hb.host is host                     # one history for the host
        wait_for(lambda: len(a.hb.intervals) >= 5 and len(b.hb.intervals) >= 5, 30.0, "a few beats of each")
        assert ctl.submit(lambda: host.longest(time.monotonic())).result(10) > 0
        assert ctl.inject_fault(b.proc_id, "hang")
        died = wait_for(lambda: next((e for e in events if e.kind == "died" and e.proc_id == b.proc_id), None),
                        40.0, "the hung proc declared dead")
        allowed = float(re.search(r"beyond the ([\d.]+)s the heartbeat gaps seen on its host", died.reason).group(1))
        longest, now_allowed = ctl.submit(lambda: (host.longest(time.monotonic()),
                                                   b.hb.allowance(1.5, 8.0, time.monotonic()))).result(10)
        # what the gaps showed (they only grow while the other proc beats on, within the minute), twice
        # that had both procs been silent at once (a starved controller)
        assert 1.5 <= allowed <= 2 * now_allowed + 0.05 and now_allowed >= GAP_MARGIN * longest - 1e-9, died.reason
        assert not any(e.kind == "died" and e.proc_id == a.proc_id for e in events)  # its neighbour lives


def test_local_procs_beat_through_the_board_and_a_freeze_is_still_seen():
    """On the controller's host a proc's heartbeat is a store into its board slot, not a message: its
    slot advances, the supervisor's record follows it, and a frozen proc is declared dead as before."""
    from rlmesh.actor.controller import Controller

    with rm.this_host().spawn_procs(per_host={"procs": 1}, name="boarded") as procs:
        c = procs.spawn("frozen", Counter)
        ctl = Controller.get()
        rec = ctl.procs[f"{procs.name}.0"]
        assert rec.board_slot is not None and ctl._board.procs[rec.board_slot] is rec
        first = ctl._board.read()[rec.board_slot]
        wait_for(lambda: ctl._board.read()[rec.board_slot] > first + 0.3, 10.0, "a newer heartbeat on the board")
        wait_for(lambda: rec.last_hb >= first + 0.3, 10.0, "last_hb from the board")  # taken from the board: no message carried it
        c.freeze_soon.call_one(0.2).get(timeout=10)
        with pytest.raises(rm.ActorDied, match="heartbeat"):
            c.sleep.call_one(30).get(timeout=15)


def test_procs_off_the_board_beat_by_message_and_a_freeze_is_seen():
    """A launcher whose procs live elsewhere (pods) gets no board: the message path judges a hang."""
    from rlmesh.actor.controller import Controller
    from rlmesh.launch.local import HostMesh, LocalLauncher

    launcher = LocalLauncher()
    launcher.same_host = False  # as a pod launcher: heartbeats arrive as messages
    with HostMesh(launcher).spawn_procs(per_host={"procs": 1}, name="unboarded") as procs:
        c = procs.spawn("frozen", Counter)
        rec = Controller.get().procs[f"{procs.name}.0"]
        assert rec.board_slot is None
        joined = rec.last_hb
        wait_for(lambda: rec.last_hb > joined + 0.3, 10.0, "a newer heartbeat message")
        c.freeze_soon.call_one(0.2).get(timeout=10)
        with pytest.raises(rm.ActorDied, match="heartbeat"):
            c.sleep.call_one(30).get(timeout=15)


def test_a_callers_socket_to_a_dead_proc_is_closed_at_its_next_call(events):
    """zmq would retry a dead proc's address forever (a controller outliving many procs spent a core
    on it): the caller's thread closes its socket to that address the next time it sends."""
    from rlmesh.actor.client import get_client

    with rm.this_host().spawn_procs(per_host={"procs": 2}, name="deadsock") as procs:
        c = procs.spawn("c", Counter)
        c.incr.call().get(timeout=30)  # this thread now holds a socket to each proc
        bag = get_client()._tls.bag
        victim = get_client().directory[f"{procs.name}.1"].addr
        assert victim in bag.socks
        os.kill(procs.pids[1], signal.SIGKILL)
        wait_for(lambda: any(e.kind == "died" and e.proc_mesh == procs.name for e in events), 10.0, "the proc declared dead")
        c.slice(procs=0).incr.call_one().get(timeout=30)
        assert victim not in bag.socks
        assert get_client().directory[f"{procs.name}.0"].addr in bag.socks


def test_exception_in_init_reaches_spawn_caller():
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        with pytest.raises(rm.ActorError) as ei:
            procs.spawn("bad", BadInit)
        assert "cannot start: no config" in str(ei.value) and ei.value.endpoint == "__init__"
        assert 'raise RuntimeError("cannot start: no config")' in ei.value.remote_traceback
        ok = procs.spawn("good", Counter)  # the proc survived
        assert ok.value.call_one().get(timeout=10) == 0


def test_idle_workers_stay_while_their_controller_lives():
    """Workers exit when the controller goes silent; an idle but live controller keeps them."""
    env = {"RLMESH_CONTROLLER_TIMEOUT_S": "1.0"}
    with rm.this_host().spawn_procs(per_host={"procs": 1}, env=env) as procs:
        c = procs.spawn("idle", Counter)
        assert c.incr.call_one().get(timeout=10) == 1
        time.sleep(2.5)  # no calls and no control traffic but heartbeats for well over the timeout
        assert c.incr.call_one().get(timeout=10) == 2
        assert procs.states() == ["alive"]


@pytest.mark.parametrize("kind,reason", [("kill", ""), ("hang", "heartbeat")])
def test_fault_injector_kills_or_hangs_on_schedule_and_restarts_recover(events, kind, reason):
    from rlmesh.actor.faults import FaultInjector

    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=-1)) as procs:
        c = procs.spawn(f"chaos_{kind}", Counter)
        with FaultInjector(c, kind=kind, every_s=0.3, seed=3, max_faults=1) as inj:
            wait_for(lambda: len(inj.injected) == 1, timeout=10, what="one injected fault")
        victim_rank = int(inj.injected[0].rsplit(".", 1)[1])
        wait_for(lambda: any(e.kind == "restarted" and e.proc_mesh == procs.name for e in events), timeout=20,
                 what="the proc restarted")
        procs.wait_alive(timeout=20)
        assert c.incr.call().get(timeout=10).values() == [1, 1]
        mine = [e for e in events if e.proc_mesh == procs.name and e.rank == victim_rank]
        kinds = [e.kind for e in mine]
        assert kinds.index("fault_injected") < kinds.index("died") < kinds.index("restarted")
        died = next(e for e in mine if e.kind == "died")
        assert reason in died.reason and (kind != "kill" or died.signal == 9)


def test_a_turn_with_no_live_target_is_retried_soon_not_a_period_later(events):
    """``faults=generator_kill`` once injected nothing: its first turn found no live generator (restarting on a
    busy host), and the next came 15 s later, after the run had ended. Such a turn is now retried within
    ``RETRY_S``, so the first fault still comes at once."""
    from rlmesh.actor.faults import FaultInjector

    with rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=-1)) as procs:
        c = procs.spawn("chaos_retry", Counter)
        os.kill(procs.pids[0], signal.SIGKILL)  # the only target is down while the injector's first turn looks
        wait_for(lambda: procs.states() != ["alive"], timeout=10, what="the proc seen as not alive")
        with FaultInjector(c, kind="kill", every_s=600, start_after_s=0, seed=1, max_faults=1) as inj:
            wait_for(lambda: len(inj.injected) == 1, timeout=40, what="the fault once the proc was back")
