"""Every endpoint verb, slicing and context, against real worker procs on loopback."""

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

import rlmesh as rm
from runtime_actors import Counter, Relay

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def procs():
    with rm.this_host().spawn_procs(per_host={"procs": 4}) as p:
        yield p


@pytest.fixture(scope="module")
def counters(procs):
    return procs.spawn("counter", Counter, start=5)


def test_call_returns_value_mesh_in_rank_order(counters):
    before = counters.value.call().get(timeout=10).values()
    vm = counters.incr.call(2).get(timeout=10)
    assert isinstance(vm, rm.ValueMesh)
    assert vm.values() == [b + 2 for b in before]
    assert vm.shape == {"procs": 4} and len(vm) == 4
    assert vm[{"procs": 3}] == vm[3]


def test_context_in_actor(counters, procs):
    info = counters.where.call().get(timeout=10)
    assert [i["rank"] for i in info] == [0, 1, 2, 3]
    assert all(i["mesh"] == "counter" and i["shape"] == {"procs": 4} for i in info)
    assert [i["coords"] for i in info] == [{"procs": r} for r in range(4)]
    assert len({i["real_pid"] for i in info}) == 4 and all(i["pid"] == i["real_pid"] for i in info)
    assert [i["real_pid"] for i in info] == procs.pids
    assert info[2]["actor_id"] == "counter/2"


def test_call_one_needs_exactly_one(counters):
    one = counters.slice(procs=1)
    assert len(one) == 1 and one.shape == {}
    assert one.where.call_one().get(timeout=10)["rank"] == 1
    with pytest.raises(ValueError, match="exactly one actor"):
        counters.where.call_one()


def test_slice_ranges(counters):
    sub = counters.slice(procs=slice(1, 3))
    assert sub.shape == {"procs": 2} and len(sub) == 2
    assert [i["rank"] for i in sub.where.call().get(timeout=10)] == [1, 2]


def test_choose_avoids_busy_actor(counters):
    busy = counters.slice(procs=0).sleep.call_one(1.0)
    picks = {counters.where.choose().get(timeout=10)["rank"] for _ in range(6)}
    assert 0 not in picks
    assert busy.get(timeout=10) == 0


def test_broadcast_is_fire_and_forget(counters):
    before = counters.value.call().get(timeout=10).values()
    assert counters.incr.broadcast(10) is None
    deadline = time.monotonic() + 10
    while counters.value.call().get(timeout=10).values() != [b + 10 for b in before]:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_stream_yields_in_completion_order(counters, tmp_path):
    assert sorted(counters.block.stream(0.0)) == [0, 1, 2, 3]

    async def collect():
        return [v async for v in counters.sleep.stream(0.0)]

    assert sorted(asyncio.run(collect())) == [0, 1, 2, 3]
    # the test releases rank 3 first, then 2, 1, 0: the stream must yield in that order, not rank order
    gates = [tmp_path / f"go{r}" for r in range(4)]
    staggered = iter(rm.actor.mesh.Stream([counters.slice(procs=r).wait_for_file.call_one(str(gates[r]))
                                           for r in range(4)]))
    for r in (3, 2, 1, 0):
        gates[r].touch()
        assert next(staggered) == r


def test_waiting_less_than_the_call_leaves_it_pending_and_its_reply_still_arrives(counters, tmp_path):
    one = counters.slice(procs=1)
    gate = tmp_path / "go"
    fut = one.wait_for_file.call_one(str(gate))
    with pytest.raises(TimeoutError, match="still pending"):
        fut.get(timeout=0.05)
    assert not fut.done()

    async def give_up_then_wait():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(fut, 0.05)  # cancels this await, not the call
        gate.touch()
        return await fut

    assert asyncio.run(give_up_then_wait()) == 1
    assert fut.get(timeout=0) == 1


def test_many_threads_and_an_event_loop_calling_at_once_each_get_their_own_replies(counters):
    """Blocking callers take turns reading the shared inbox (whoever holds it completes everyone's
    futures); awaited calls are completed by whichever thread reads them. Every reply must reach its
    own caller, none may be lost or hang."""
    ranks = len(counters)
    errors: list[BaseException] = []

    def blocking_caller(t: int) -> None:
        try:
            for i in range(150):
                one = counters.slice(procs=i % ranks)
                x = (t, i)
                if i % 10 == 0:  # a mesh-wide call now and then: a gathered future among the single ones
                    assert counters.echo.call(x).get(timeout=30).values() == [x] * ranks
                else:
                    assert one.echo.call_one(x).get(timeout=30) == x
        except BaseException as exc:  # noqa: BLE001 - reported below, with the thread's number
            errors.append(exc)

    async def awaiting_caller() -> list:
        return await asyncio.gather(*[counters.slice(procs=i % ranks).echo.call_one(("aio", i)) for i in range(300)])

    threads = [threading.Thread(target=blocking_caller, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    awaited = asyncio.run(awaiting_caller())
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert not any(th.is_alive() for th in threads)
    assert awaited == [("aio", i) for i in range(300)]


def test_threads_that_wait_on_calls_and_end_leave_no_file_descriptors_behind(counters):
    """A thread that blocks in ``get()`` gets a wake-up eventfd for its waits, kept between them; a thread
    pool's threads come and go, so it is closed when its thread ends (they were never closed before)."""
    import gc
    import os

    def eventfds() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
            except OSError:  # closed between the listing and the read
                pass
        return n

    one = counters.slice(procs=0)
    one.echo.call_one(0).get(timeout=30)  # this thread's own waiter exists before the count
    before = eventfds()
    for batch in range(3):
        threads = [threading.Thread(target=lambda i=i: one.echo.call_one(i).get(timeout=30)) for i in range(20)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not any(th.is_alive() for th in threads)
    gc.collect()
    assert eventfds() - before < 10, "every thread that waited left its eventfd open"


def test_calls_sent_from_threads_that_end_at_once_are_not_lost(counters):
    """A thread's sockets close when it ends; a call still queued on one (its connection not made yet, as
    for a thread's first call to a proc) must still reach the actor, not be dropped with the socket."""
    results: dict[int, int] = {}
    all_done = threading.Event()

    def fire(i: int) -> None:
        def done(f):
            results[i] = f.get()
            if len(results) == 40:
                all_done.set()
        counters.slice(procs=i % 4).echo.call_one(i).add_done_callback(done)

    for batch in range(2):
        threads = [threading.Thread(target=fire, args=(20 * batch + i,)) for i in range(20)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
    assert all_done.wait(20), f"calls lost: {sorted(set(range(40)) - set(results))}"
    assert results == {i: i for i in range(40)}


@pytest.fixture
def parked(monkeypatch, counters):
    """The caller's IO thread parked off the inbox, as it is while threads block in ``get()``, with its
    safety-net look-again pushed past these tests' bounds: a consumer whose wake-up is missed waits for
    that (two minutes) instead of 50 ms, and fails the test instead of passing slowly."""
    from rlmesh.actor import client as client_mod

    monkeypatch.setattr(client_mod, "_PARKED_S", 120.0)
    import os

    cl = client_mod.get_client()
    os.eventfd_write(cl._efd, 1)  # its next look starts now, with the patched interval
    one = counters.slice(procs=0)
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the IO thread never parked while this thread drove the inbox"
        one.sleep.call_one(0.06).get(timeout=30)  # a wait that outlasts a look it may be in (50 ms)
        if cl._io_parked and not cl._drivers:
            time.sleep(0.05)  # not just between setting the flag and reading the drivers (then it unparks)
            if cl._io_parked:
                return cl


def test_an_await_after_blocking_calls_wakes_the_parked_io_thread(parked, counters):
    async def main():
        return await asyncio.wait_for(counters.slice(procs=1).echo.call_one(7), 10)

    assert asyncio.run(main()) == 7


def test_a_done_callback_after_blocking_calls_wakes_the_parked_io_thread(parked, counters):
    done = threading.Event()
    counters.slice(procs=1).echo.call_one(8).add_done_callback(lambda f: done.set())
    assert done.wait(10), "a call consumed by a callback was never read"
    stream = counters.echo.stream(9)  # a Stream waits on its callbacks, not on the inbox
    got = []
    reader = threading.Thread(target=lambda: got.extend(stream), daemon=True)
    reader.start()
    reader.join(10)
    assert got == [9, 9, 9, 9]


def test_get_finds_replies_that_arrived_before_it_waited(parked, counters, monkeypatch):
    """``get()`` waits on the inbox's descriptor before it reads (no read first): replies already there when
    it starts must wake it. With the IO thread parked and the waits' own look-again pushed to a minute, a
    reply that did not wake the wait would fail the bound below instead of costing 200 ms."""
    from rlmesh.actor import client as client_mod

    monkeypatch.setattr(client_mod, "_DRIVE_POLL_MS", 60_000)
    for n in (1, 5):
        futs = [counters.slice(procs=i % 4).echo.call_one(i) for i in range(n)]
        time.sleep(0.3)  # the replies are in the inbox by now, most likely; none read yet
        assert [f.get(timeout=10) for f in futs] == list(range(n))


def test_the_last_driver_leaving_with_calls_pending_wakes_the_parked_io_thread(parked, counters, tmp_path):
    """A callback added while a thread drives the inbox wakes no one (the driver reads every reply); if that
    call is still pending when the driver leaves, the IO thread must take over its reply. Files order it:
    the driver's call ends only after the callback is registered, the other only after the driver left."""
    go, late = tmp_path / "go", tmp_path / "late"
    done = threading.Event()
    registered = threading.Event()

    def add_while_driven():
        while not parked._drivers:  # registered while the main thread is blocked below, not after
            time.sleep(0.001)
        counters.slice(procs=2).wait_for_file.call_one(str(late)).add_done_callback(lambda f: done.set())
        registered.set()
        go.touch()

    th = threading.Thread(target=add_while_driven, daemon=True)
    th.start()
    assert counters.slice(procs=1).wait_for_file.call_one(str(go)).get(timeout=30) == 1  # that actor's rank
    assert registered.is_set(), "the callback was not registered while this thread drove the inbox"
    late.touch()  # the pending call ends now, with no thread driving the inbox
    assert done.wait(10), "the reply of a call pending when the last driver left was never read"
    th.join(10)


def test_await_and_gather_from_asyncio(counters):
    async def main():
        a, b = await asyncio.gather(counters.value.call(), counters.slice(procs=2).value.call_one())
        return a, b

    a, b = asyncio.run(main())
    assert a[2] == b


def test_an_async_endpoints_first_step_runs_inside_its_own_task(counters):
    """An endpoint's first line may be ``async with asyncio.timeout(...)``, which needs a current task: any
    change that starts calls faster (an eager first step, tried in docs/performance.md) must keep that."""
    for wait_s in (0.0, 0.05):
        got = counters.in_task.call(wait_s).get(timeout=10).values()
        assert [g["rank"] for g in got] == [0, 1, 2, 3]
        assert all(g["in_task"] and g["same_task"] for g in got)


def test_remote_exception_carries_traceback_and_actor_keeps_serving(counters):
    with pytest.raises(rm.ActorError) as ei:
        counters.slice(procs=3).fail.call_one("bad input 42").get(timeout=10)
    err = ei.value
    assert err.mesh == "counter" and err.rank == 3 and err.endpoint == "fail"
    assert err.remote_type == "builtins.ValueError"
    assert "bad input 42" in str(err) and "raise ValueError(msg)" in str(err)
    assert isinstance(err.exception, ValueError)
    assert counters.slice(procs=3).where.call_one().get(timeout=10)["rank"] == 3


def test_unpicklable_argument_fails_at_the_call(counters):
    with pytest.raises(rm.SerializationError, match="_thread.lock"):
        counters.echo.call(threading.Lock())


def test_unpicklable_result_is_named(counters):
    with pytest.raises(rm.ActorError, match="_thread.lock"):
        counters.slice(procs=0).bad_result.call_one().get(timeout=10)


def test_unknown_endpoint_lists_the_real_ones(counters):
    with pytest.raises(AttributeError, match="no endpoint 'nope'.*incr"):
        counters.nope  # noqa: B018 (the attribute read is what raises)


def test_timeout_option(counters):
    with pytest.raises(rm.CallTimeout, match="timeout"):
        counters.slice(procs=0).sleep.options(timeout=0.2).call_one(5).get(timeout=10)


def test_tensor_and_array_arguments_roundtrip(counters):
    t = torch.randn(256, 1024)
    back = counters.slice(procs=1).echo.call_one({"t": t, "a": np.arange(100000)}).get(timeout=10)
    assert torch.equal(back["t"], t) and (back["a"] == np.arange(100000)).all()


def test_spawn_on_slices_trainer_and_generators(procs):
    trainer = procs.slice(procs=0).spawn("trainer", Counter, start=100)
    gens = procs.slice(procs=slice(1, 4)).spawn("gens", Counter)
    assert trainer.where.call_one().get(timeout=10)["real_pid"] == procs.pids[0]
    g = gens.where.call().get(timeout=10)
    assert [x["real_pid"] for x in g] == procs.pids[1:]
    assert [x["rank"] for x in g] == [0, 1, 2] and g[0]["shape"] == {"procs": 3}


def test_duplicate_mesh_name_refused(procs, counters):
    with pytest.raises(ValueError, match="exists already"):
        procs.spawn("counter", Counter)


def test_kv_rendezvous_between_actors(procs):
    relays = procs.slice(procs=slice(0, 2)).spawn("kvrelay", Relay)
    a, b = relays.slice(procs=0), relays.slice(procs=1)
    waiting = b.kv_get.call_one("rendezvous/x", 10)
    time.sleep(0.1)
    a.kv_put.call_one("rendezvous/x", {"addr": "tcp://127.0.0.1:1"}).get(timeout=10)
    assert waiting.get(timeout=10) == {"addr": "tcp://127.0.0.1:1"}
    with pytest.raises(rm.ActorError, match="not present"):
        b.kv_get.call_one("rendezvous/missing", 0.2).get(timeout=10)
    assert rm.actor.kv.get("rendezvous/x", timeout=1) == {"addr": "tcp://127.0.0.1:1"}


def test_sync_endpoint_can_call_other_actors(procs, counters):
    relay = procs.slice(procs=0).spawn("syncrelay", Relay, counters)
    before = counters.value.call().get(timeout=10).values()
    assert relay.forward_sync.call_one(1).get(timeout=10) == [b + 1 for b in before]
