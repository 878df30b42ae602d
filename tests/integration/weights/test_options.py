"""Publisher options and the errors that name the fix."""

import errno
import os

import pytest
import torch

from rlmesh.actor.kv import LocalKV
from rlmesh.weights import Publisher, Subscriber, TransportUnavailableError, WeightSyncError
from rlmesh.weights import assemble, slots

pytestmark = pytest.mark.timeout(30)


def test_bad_options_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="keep must be >= 1"):
        Publisher("opt", keep=0, directory=LocalKV())
    with pytest.raises(ValueError, match=r"choose from \['shm', 'tcp', 'rdma', 'cuda-ipc'\]"):
        Publisher("opt", transports=("shm", "udp"), directory=LocalKV())
    with pytest.raises(ValueError, match="not one of"):
        Subscriber("opt", "carrier-pigeon", directory=LocalKV())


def test_shm_only_publisher_serves_no_network_readers():
    d = LocalKV()
    with Publisher("opt-shm", transports=("shm",), directory=d) as pub:
        pub.publish({"w": torch.ones(2)}, version=1)
        assert pub.record()["tcp"] is None
        assert Subscriber("opt-shm", directory=d).pull()[1].stats.transport == "shm"
        with pytest.raises(TransportUnavailableError, match="without 'tcp'"):
            Subscriber("opt-shm", "tcp", directory=d).pull(timeout=1)


def test_keep_one_still_never_overwrites_a_held_version():
    d = LocalKV()
    with Publisher("opt-keep1", keep=1, directory=d) as pub:
        pub.publish({"w": torch.full((1000,), 1.0)}, version=1)
        sub = Subscriber("opt-keep1", "shm", directory=d)
        held = sub._transport(False, 5).fetch(1, None, 5)
        try:
            pub.publish({"w": torch.full((1000,), 2.0)}, version=2)
            assert pub.versions() == [2] and len(pub.pool.slots) == 2  # a second slot instead of waiting
            assemble.verify(held.manifest, held.sources)
        finally:
            held.release()
        pub.publish({"w": torch.full((1000,), 3.0)}, version=3)  # now the first slot is free again
        assert len(pub.pool.slots) == 2 and sub.pull()[0]["w"][0].item() == 3.0


def test_missing_publisher_times_out_with_the_fix():
    with pytest.raises(WeightSyncError, match=r"create rm.weights.Publisher\('nobody'\)"):
        Subscriber("nobody", directory=LocalKV(), timeout=0.2).pull(timeout=0.2)


def test_reserve_makes_the_slots_the_first_publishes_write():
    """reserve() creates the slots ahead (on a thread); the first two versions are written into them
    (no slot is created during publish) and read back exactly; a bigger model still gets a slot."""
    d = LocalKV()
    sd = {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3)}
    with Publisher("opt-reserve", directory=d) as pub:
        pub.reserve(sd, wait=True)
        reserved = [s.path for s in pub.pool.slots]
        assert len(reserved) == 2 and all(s.version == -1 for s in pub.pool.slots)
        pub.reserve(sd, wait=True)  # idempotent: enough empty slots exist already
        assert [s.path for s in pub.pool.slots] == reserved
        sub = Subscriber("opt-reserve", "shm", directory=d)
        for v in (1, 2):
            pub.publish({k: t + v for k, t in sd.items()}, version=v)
            assert [s.path for s in pub.pool.slots] == reserved
            got, ver = sub.pull(min_version=v)
            assert int(ver) == v and torch.equal(got["w"], sd["w"] + v)
        pub.publish({"w": torch.zeros(10_000)}, version=3)  # outgrows them: a fresh, bigger slot
        assert sub.pull(min_version=3)[0]["w"].shape == (10_000,)
    with Publisher("opt-reserve-keep1", keep=1, directory=d) as pub:
        pub.reserve(sd)  # in the background; publish waits for it instead of making its own slot
        pub.publish(sd, version=1)
        assert len(pub.pool.slots) == 1


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def test_reserve_populates_the_first_slot_ahead_and_every_version_reads_back_exactly():
    """reserve() populates the first version's slot on its thread (its pages' allocation then leaves the
    first publish); the second slot and a reader's prepare() allocate nothing (its pages come with
    version 2's pwrite). Versions written through the populated mapping, through pwrite, and through
    a slot populated only in part (a publish right after reserve stops the populator) read back exactly."""
    d = LocalKV()
    mib = 1 << 20
    sd = {"w": torch.arange(4 * mib // 4, dtype=torch.float32), "b": torch.ones(3, dtype=torch.float64)}
    with Publisher("opt-fresh", directory=d) as pub:
        pub.reserve(sd, wait=True)
        pub._reserving.join()  # population done (no publish stops it)
        first, second = pub.pool.slots
        assert first.populated >= 4 * mib and _allocated(first.path) >= 4 * mib
        assert second.fresh and second.populated == 0 and _allocated(second.path) < mib
        sub = Subscriber("opt-fresh", "shm", directory=d)
        assert sub.prepare() is True
        assert _allocated(second.path) < mib  # mapped, not populated
        for v in range(1, 5):  # 1: populated slot, 2: pwrite into the fresh one, 3 and 4: written slots
            stats = pub.publish({k: t + v for k, t in sd.items()}, version=v)
            slot = next(s for s in pub.pool.slots if s.idx == stats.slot)
            assert not slot.fresh and _allocated(slot.path) >= 4 * mib
            got, ver = sub.pull(min_version=v)
            assert int(ver) == v and all(torch.equal(got[k], sd[k] + v) for k in sd)
        assert len(pub.pool.slots) == 2
    big = {f"w{i}": torch.full((mib // 4,), float(i)) for i in range(48)}  # 48 MiB: more than one 32 MiB step
    with Publisher("opt-partial", directory=d) as pub:
        pub.reserve(big, wait=True)
        pub.publish(big, version=1)  # at once: the populator stops wherever it got to
        got, ver = Subscriber("opt-partial", "shm", directory=d).pull(min_version=1)
        assert int(ver) == 1 and all(torch.equal(got[k], big[k]) for k in big)


def test_a_tcp_readers_prepare_readies_a_staging_buffer_of_the_reserved_size():
    """reserve() puts its size in the directory record; a TCP reader's prepare() allocates its staging
    buffer that big and faults it in on a thread (the first pull waits for it), and the pulls into it
    read back exactly. Without a reservation prepare() readies nothing."""
    d = LocalKV()
    sd = {"w": torch.arange(1 << 18, dtype=torch.float32), "b": torch.ones(3, dtype=torch.float64)}
    with Publisher("opt-tcp-warm", directory=d) as pub:
        sub = Subscriber("opt-tcp-warm", "tcp", directory=d)
        assert sub.prepare() is True and sub._readers["tcp"]._staging is None  # nothing reserved yet
        pub.reserve(sd, wait=True)
        assert pub.record()["reserved"] >= (1 << 20)
        sub2 = Subscriber("opt-tcp-warm", "tcp", directory=d)
        assert sub2.prepare() is True
        reader = sub2._readers["tcp"]
        assert reader._staging is not None and reader._staging.numel() == pub.record()["reserved"]
        for v in (1, 2):
            pub.publish({k: t + v for k, t in sd.items()}, version=v)
            got, ver = sub2.pull(min_version=v)
            assert int(ver) == v and all(torch.equal(got[k], sd[k] + v) for k in sd)


def test_a_full_shm_dir_is_an_error_naming_the_fix_at_reserve_and_at_publish(monkeypatch):
    """No room for a slot: reserve() logs it, publish() raises an OSError that says how to make room;
    a write the kernel refuses midway (ENOSPC from pwrite) says the same, and the publisher goes on."""
    d = LocalKV()
    sd = {"w": torch.ones(1 << 16)}
    with Publisher("opt-full", directory=d) as pub:
        monkeypatch.setattr(slots, "_free_bytes", lambda fd: 4096)
        pub.reserve(sd, wait=True)
        assert pub.pool.slots == []
        with pytest.raises(OSError, match="cannot reserve .* enlarge it"):
            pub.publish(sd, version=1)
        monkeypatch.undo()

        def full(fd, data, pos):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(slots.os, "pwrite", full)
        with pytest.raises(OSError, match="cannot reserve .* enlarge it") as ei:
            pub.publish(sd, version=1)
        assert ei.value.errno == errno.ENOSPC
        monkeypatch.undo()
        pub.publish(sd, version=1)
        got, ver = Subscriber("opt-full", "shm", directory=d).pull(min_version=1)
        assert int(ver) == 1 and torch.equal(got["w"], sd["w"])


def test_prepare_maps_the_reserved_slots_and_lets_go_of_dropped_ones():
    """Subscriber.prepare() (a generator's __init__) maps the slots a publisher reserved, so the first
    pulls map nothing; the pulls read exactly; a slot the publisher drops is unmapped by the next
    fetch (a mapping would keep its memory alive). Without a publisher, prepare is a no-op."""
    d = LocalKV()
    assert Subscriber("opt-prep-none", directory=d).prepare() is False
    sd = {"w": torch.arange(4096, dtype=torch.float32)}
    with Publisher("opt-prep", directory=d) as pub:
        pub.reserve(sd, wait=True)
        reserved = {s.path for s in pub.pool.slots}
        sub = Subscriber("opt-prep", "shm", directory=d)
        assert sub.prepare() is True
        reader = sub._readers["shm"]
        assert set(reader._maps) == reserved
        mapped = {p: id(m) for p, m in reader._maps.items()}
        for v in (1, 2):
            pub.publish({"w": sd["w"] + v}, version=v)
            got, ver = sub.pull(min_version=v)
            assert int(ver) == v and torch.equal(got["w"], sd["w"] + v)
        assert {p: id(m) for p, m in reader._maps.items()} == mapped  # the same mappings, none made by pulls
        pub.publish({"w": torch.zeros(10_000)}, version=3)  # outgrows them: the free one is dropped, a bigger slot made
        assert sub.pull(min_version=3)[0]["w"].shape == (10_000,)
        live = {s.path for s in pub.pool.slots}
        assert reserved - live  # v1's slot was dropped (v2's is kept: the newest stays readable)
        assert set(reader._maps) <= live and not (set(reader._maps) & (reserved - live))
