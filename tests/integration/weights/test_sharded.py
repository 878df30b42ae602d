"""Sharded weights: every rank publishes its part of a version, a Subscriber assembles the whole.

Real shared-memory slots and real zmq TCP (the publishers' servers run in this process, as in the
transport suite); the kill case SIGKILLs a real publishing process mid-write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from rlmesh.actor.kv import LocalKV
from rlmesh.weights import Subscriber, WeightSyncError, rdma_plan
from rlmesh.actor import kv
from rlmesh.weights import plugin
from rlmesh.weights.directory import FileDirectory, publisher_key, this_proc_id
from rlmesh.weights.sharded import ShardPiece, ShardPublisher, shard_name
from rlmesh.weights.slots import cleanup_segments
from _support.waiting import wait_for


def whole(version: int) -> dict[str, torch.Tensor]:
    """A model's state dict with runs that cut words in two (a bf16 row of 3, a float16 vector of 5),
    a scalar, an empty tensor and one of several TCP chunks."""
    g = torch.Generator().manual_seed(version)
    return {"rows": torch.randn(5, 3, generator=g).to(torch.bfloat16), "vec": torch.randn(5, generator=g).half(),
            "scalar": torch.tensor(float(version)), "empty": torch.zeros(0, 3), "ints": torch.arange(9) * version,
            "big": torch.randn(3 << 20, generator=g)}


def pieces(sd: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, ShardPiece]:
    """Rank ``rank``'s part: ``rows`` cut by rows as FSDP2 cuts dim 0 (ceil), the rest as replicas."""
    out = {k: ShardPiece.of_replica(v, rank, world) for k, v in sd.items()}
    per = -(-sd["rows"].shape[0] // world)
    a, b = min(rank * per, 5), min((rank + 1) * per, 5)
    out["rows"] = ShardPiece(sd["rows"][a:b], (5, 3), a * 3)
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k])
                                    for k in a)


@pytest.fixture
def ranks(request):
    world = getattr(request, "param", 2)
    d = LocalKV()
    pubs = [ShardPublisher("sharded", r, world, "set-a", directory=d) for r in range(world)]
    yield d, pubs
    for p in pubs:
        p.close()


def publish(pubs, version: int, sd=None) -> dict[str, torch.Tensor]:
    sd = whole(version) if sd is None else sd
    for r, p in enumerate(pubs):
        p.publish(pieces(sd, r, len(pubs)), version)
    return sd


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("ranks", [2, 3], indirect=True)
def test_a_subscriber_assembles_every_rank_s_parts_bit_equal(ranks, transport):
    d, pubs = ranks
    want = publish(pubs, 1)
    with Subscriber("sharded", transport, directory=d) as sub:
        got, v = sub.pull(min_version=1, timeout=10)
        assert v == 1 and v.stats.transport == transport and v.stats.bytes == sum(t.nbytes for t in want.values())
        assert same(got, want)
        want = publish(pubs, 2)
        target = {k: torch.zeros_like(t) for k, t in want.items()}
        assert sub.pull_into(target, min_version=2, timeout=10) == 2
        assert same(target, want)
        assert sub.latest_version() == 2


@pytest.mark.timeout(60)
def test_every_rank_s_part_arrives_by_rdma_read_over_emulated_verbs(monkeypatch):
    import fake_pyverbs

    fake_pyverbs.install(monkeypatch)  # the RDMA reader's real code, over verbs that check the rules
    rdma_plan.available.cache_clear()
    d = LocalKV()
    pubs = [ShardPublisher("sharded-rdma", r, 2, "set-a", directory=d) for r in range(2)]
    try:
        want = publish(pubs, 1)
        before = fake_pyverbs.stats["reads"]
        with Subscriber("sharded-rdma", "rdma", directory=d) as sub:
            got, v = sub.pull(min_version=1, timeout=10)
        assert v == 1 and v.stats.transport == "rdma" and same(got, want)
        assert fake_pyverbs.stats["reads"] - before >= 2  # at least one READ from each rank's region
    finally:
        for p in pubs:
            p.close()
        rdma_plan.available.cache_clear()


@pytest.mark.timeout(60)
def test_prepare_waits_for_no_rank_and_maps_every_rank_once_all_are_up():
    d = LocalKV()
    p0 = ShardPublisher("sharded-prep", 0, 2, "set-a", directory=d)
    p1 = None
    try:
        with Subscriber("sharded-prep", directory=d, timeout=30) as sub:
            t0 = time.monotonic()
            assert not sub.prepare()  # rank 1 has no publisher yet: nothing to wait for in a generator's __init__
            assert time.monotonic() - t0 < 10  # a gross bound: the rank lookup does not wait out the 30 s
            p1 = ShardPublisher("sharded-prep", 1, 2, "set-a", directory=d)
            assert sub.prepare()
            want = publish([p0, p1], 1)
            got, v = sub.pull(min_version=1, timeout=5)
            assert v == 1 and same(got, want)
    finally:
        p0.close()
        if p1 is not None:
            p1.close()


def test_the_set_record_is_withdrawn_with_rank_0s_proc():
    """The controller withdraws a dead proc's weight records (rlmesh.weights.plugin): the set's record
    goes with rank 0's, so a generator looks for the restarted mesh's set instead of the dead one's."""
    pubs = [ShardPublisher("sharded-gone", r, 2, "set-a") for r in range(2)]  # the runtime's KV (this process's)
    try:
        names = [publisher_key("sharded-gone"), *(publisher_key(shard_name("sharded-gone", r)) for r in range(2))]
        assert kv.get(names[0], 0)["set"] == "set-a"
        plugin._withdraw_records(this_proc_id(), os.getpid())  # as on the died event of this proc
        for key in names:
            with pytest.raises(KeyError):
                kv.get(key, 0)
    finally:
        for p in pubs:
            p.close()


@pytest.mark.timeout(60)
def test_a_version_is_delivered_only_once_every_rank_of_the_set_holds_it(ranks):
    d, (p0, p1) = ranks
    v1 = publish([p0, p1], 1)
    p0.publish(pieces(whole(2), 0, 2), 2)  # rank 1 is still writing version 2
    with Subscriber("sharded", "shm", directory=d) as sub:
        assert sub.latest_version() == 1
        got, v = sub.pull(timeout=5)
        assert v == 1 and same(got, v1)  # not rank 0's version 2 beside rank 1's version 1
        with pytest.raises(WeightSyncError, match="no version >= 2"):
            sub.pull(min_version=2, timeout=0.3)
        p1.publish(pieces(whole(2), 1, 2), 2)
        got, v = sub.pull(min_version=2, timeout=5)
        assert v == 2 and same(got, whole(2))


@pytest.mark.timeout(60)
def test_a_part_of_another_set_is_never_joined_to_this_one(ranks):
    d, (p0, p1) = ranks
    p0.publish(pieces(whole(1), 0, 2), 1)
    p1.close()  # rank 1 died; a part with its number, from another incarnation of the mesh, takes its record
    stranger = ShardPublisher("sharded", 1, 2, "set-b", directory=d)
    try:
        stranger.publish(pieces(whole(1), 1, 2), 1)
        with Subscriber("sharded", "shm", directory=d) as sub:
            with pytest.raises(WeightSyncError, match="no version >= 1"):
                sub.pull(min_version=1, timeout=0.5)
    finally:
        stranger.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_corrupted_part_is_rejected_and_the_target_left_untouched(ranks, transport):
    d, pubs = ranks
    publish(pubs, 1)
    pub = pubs[1].publisher
    slot = next(s for s in pub.pool.slots if s.version == 1)
    e = next(e for e in pub._manifest_of(slot).entries if e.key == "vec")
    slot.data_view()[e.offset] ^= 0x10  # one bit of rank 1's run of "vec"
    target = {k: torch.full_like(t, 7) for k, t in whole(1).items()}
    with Subscriber("sharded", transport, directory=d) as sub:
        with pytest.raises(WeightSyncError, match="checksum mismatch on 'vec'"):
            sub.pull_into(target, timeout=5)
    assert all(bool((t == 7).all()) for t in target.values())


RANK1 = textwrap.dedent("""
    import os, sys, time
    import rlmesh.weights.publisher as publisher
    from rlmesh.actor import kv
    from rlmesh.weights import plugin
    from rlmesh.weights.directory import FileDirectory, publisher_key, this_proc_id
    from rlmesh.weights.sharded import ShardPublisher
    sys.path[:0] = os.environ["TESTS_PATH"].split(os.pathsep)
    from test_sharded import pieces, whole

    pub = ShardPublisher("sharded", 1, 2, "set-a", directory=FileDirectory(sys.argv[1]))
    pub.publish(pieces(whole(1), 1, 2), 1)
    real, calls = publisher._write_value, []

    def stall(dst, value):  # version 2: the first tensor written, then stop inside the second
        calls.append(1)
        if len(calls) == 2:
            open(sys.argv[2], "w").close()
            while True:
                time.sleep(0.05)
        return real(dst, value)

    publisher._write_value = stall
    pub.publish(pieces(whole(2), 1, 2), 2)
""")


@pytest.mark.timeout(240)  # a fresh interpreter importing torch: 3 s on a quiet host, 40 s at load 48
def test_a_rank_killed_mid_publish_never_yields_a_mixed_version(tmp_path):
    d = FileDirectory(tmp_path / "dir")
    mark = tmp_path / "writing"
    here = Path(__file__).resolve().parent
    env = {**os.environ, "TESTS_PATH": os.pathsep.join([str(here), str(here.parents[1])])}
    p0 = ShardPublisher("sharded", 0, 2, "set-a", directory=d)
    rank1 = subprocess.Popen([sys.executable, "-c", RANK1, str(tmp_path / "dir"), str(mark)], env=env)
    try:
        p0.publish(pieces(whole(1), 0, 2), 1)
        p0.publish(pieces(whole(2), 0, 2), 2)
        wait_for(mark.exists, 200, "rank 1 inside its publish of version 2")
        rank1.send_signal(signal.SIGKILL)
        rank1.wait(timeout=30)
        with Subscriber("sharded", "shm", directory=d) as sub:
            got, v = sub.pull(timeout=10)
            assert v == 1 and same(got, whole(1))  # both ranks' version 1: rank 1's half-written 2 is never read
            with pytest.raises(WeightSyncError, match="no version >= 2"):
                sub.pull(min_version=2, timeout=0.3)
    finally:
        if rank1.poll() is None:
            rank1.kill()
            rank1.wait(timeout=30)
        p0.close()
        cleanup_segments("local", f"pid{rank1.pid}", rank1.pid)  # what the killed rank left in /dev/shm
