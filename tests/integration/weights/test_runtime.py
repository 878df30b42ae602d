"""Weight sync inside real actor meshes: discovery through the runtime's KV, and crash cleanup of /dev/shm."""

import os
import time

import pytest

import rlmesh as rm
from _support.waiting import wait_for
from weights_actors import Generator, Trainer, Waiter

pytestmark = pytest.mark.timeout(120)


def test_trainer_publishes_generators_pull_over_shm_and_tcp():
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        trainer = procs.slice(procs=0).spawn("trainer", Trainer)
        shm_gen = procs.slice(procs=1).spawn("gen_shm", Generator)
        tcp_gen = procs.slice(procs=2).spawn("gen_tcp", Generator, transport="tcp")
        assert trainer.publish.call_one(1).get() > 0
        r1, r2 = shm_gen.pull.call_one(1).get(), tcp_gen.pull.call_one(1).get()
        assert (r1["transport"], r2["transport"]) == ("shm", "tcp")
        assert r1["reader"] == "gen_shm[0]" and r2["reader"] == "gen_tcp[0]"
        for v in (2, 3):
            trainer.publish.call_one(v).get()
            for gen in (shm_gen, tcp_gen):
                r = gen.pull.call_one(v).get()
                assert r["version"] == v and r["consistent"] and r["latest"] == v


def test_sigkilled_publisher_leaves_no_shm_segments():
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        trainer = procs.spawn("trainer_killed", Trainer)
        trainer.publish.call_one(1).get()
        trainer.publish.call_one(2).get()
        segs = trainer.segments.call_one().get()
        assert len(segs) >= 3 and any(s.endswith(".ctl") for s in segs)  # two slots and the index
        trainer.die.broadcast()
        wait_for(lambda: not any(os.path.exists(s) for s in segs), 20, "the killed proc's shm segments to be removed")


def test_clean_stop_unlinks_segments():
    procs = rm.this_host().spawn_procs(per_host={"procs": 1})
    try:
        trainer = procs.spawn("trainer_stopped", Trainer)
        trainer.publish.call_one(1).get()
        segs = trainer.segments.call_one().get()
        assert segs
    finally:
        procs.stop()
    wait_for(lambda: not any(os.path.exists(s) for s in segs), 20, "the shm segments to be removed")


def test_pulls_in_actors_land_in_weight_syncs_telemetry():
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        trainer = procs.slice(procs=0).spawn("trainer_tele", Trainer, "tele")
        gen = procs.slice(procs=1).spawn("gen_tele", Generator, "tele")
        trainer.publish.call_one(7).get()
        assert gen.pull.call_one(7).get()["version"] == 7

        def rows():
            try:
                t = rm.telemetry.query("SELECT name, version, transport, bytes, ok, reader, mesh "
                                       "FROM weight_syncs WHERE name = 'tele'")
            except Exception:
                return []
            return t.to_pylist()

        wait_for(lambda: rows(), 30, "a weight_syncs row")
        (row,) = rows()
        assert row["version"] == 7 and row["transport"] == "shm" and row["ok"] is True
        assert row["reader"] == "gen_tele[0]" and row["mesh"] == "gen_tele" and row["bytes"] > 0


def test_generator_follows_a_restarted_trainer_and_old_segments_go():
    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=1)) as procs:
        trainer = procs.slice(procs=0).spawn("trainer_restart", Trainer, "restart")
        gen = procs.slice(procs=1).spawn("gen_restart", Generator, "restart")
        trainer.publish.call_one(1).get()
        assert gen.pull.call_one(1).get()["version"] == 1
        old = trainer.segments.call_one().get()
        trainer.die.broadcast()
        wait_for(lambda: not any(os.path.exists(s) for s in old), 20, "the dead incarnation's segments to be removed")
        procs.wait_alive(timeout=60)
        trainer.publish.call_one(2).get()  # a fresh Publisher in the new incarnation
        r = gen.pull.call_one(2).get()
        assert r["version"] == 2 and r["consistent"]
        # it found the successor on this host instead of trying the dead one's TCP address (a timeout)
        assert r["transport"] == "shm" and r["transports_tried"] == ["shm"]
        assert all(not os.path.exists(s) for s in old) and trainer.segments.call_one().get()


@pytest.mark.parametrize("publisher", ["stopped_with_it", "never_created"])
def test_a_proc_stopped_while_an_endpoint_waits_for_weights_stops_at_once(tmp_path, publisher):
    """A generator waits in ``pull_into`` for a version that will never come: its trainer is stopped
    with it (the wait may be in the transport or, once the publisher's record is gone, in the KV
    lookup of it), or no trainer ever published (the wait is in the KV lookup). Its stop used to
    wait behind that endpoint (which holds the actor's thread) until the stop timeout killed it,
    every run's last telemetry rows lost; now the wait gives up when the proc is asked to stop, the
    caller hears why, and the proc exits by itself."""
    started = tmp_path / "started"
    name = f"stalled_{publisher}"
    procs = rm.this_host().spawn_procs(per_host={"procs": 2})
    try:
        if publisher == "stopped_with_it":
            trainer = procs.slice(procs=0).spawn("trainer_gone", Trainer, name)
            trainer.publish.call_one(1).get()
        waiter = procs.slice(procs=1).spawn("waiter", Waiter, name)
        fut = waiter.pull_forever.call_one(99, str(started))
        wait_for(lambda: started.exists(), 20, "the waiter to start")
        if publisher == "never_created":  # its lookup of the publisher is held by the controller: stop it there
            held = rm.actor.controller.Controller.current()._kv_service
            wait_for(lambda: len(held) > 0, 20, "the waiter's KV lookup to reach the controller")
        else:
            time.sleep(0.3)  # into its pull's wait (nothing to observe; a stop before it ends it the same way)
    finally:
        t0 = time.monotonic()
        procs.stop(timeout=30)
        took = time.monotonic() - t0
    assert took < 25, f"stop waited {took:.1f}s behind the blocked endpoint"  # a hang bound; the stop timeout is 30 s
    with pytest.raises(rm.ActorError):  # its own answer, or (the reply lost as the proc exits) the proc's stop
        fut.get(timeout=30)

    def ended() -> list:  # the endpoint's span: written when it returned, flushed before the proc exited
        try:
            return rm.telemetry.query("SELECT error FROM spans WHERE mesh = 'waiter' "
                                      "AND endpoint = 'pull_forever'").column(0).to_pylist()
        except Exception:
            return []

    # Without the change the endpoint was still blocked when the proc exited (after on_stop's 10 s
    # wait), so it never ended and left no span.
    wait_for(ended, 30, "the blocked endpoint to end")
    assert "this proc is stopping" in ended()[0]
