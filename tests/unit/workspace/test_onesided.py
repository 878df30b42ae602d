"""The pure half of one-sided chunk transfer: the FIFO ring, READ plans, the transport setting."""

import pytest

from rlmesh.workspace.onesided import TRANSPORT_ENV, ChunkTransport, FifoRing, packed_reads, transport_from_env


def test_ring_places_in_order_and_reuses_room_only_after_ack():
    r = FifoRing(100)
    assert r.place(40) == (0, 0)
    assert r.place(40) == (1, 40)
    assert r.place(30) is None  # 20 left at the end, and the front is still unread
    assert r.ack(0) == 1
    assert r.place(30) == (2, 0)  # wraps: the end's 20 bytes stay unused
    assert r.place(15) is None  # between 30 and the live batch at 40: 10 bytes
    assert r.place(10) == (3, 30)
    assert r.ack(1) == 1 and r.ack(1) == 0  # a stale ack frees nothing
    assert r.place(60) == (4, 40)
    assert r.ack(4) == 3 and r.used == 0
    assert r.place(100) == (5, 0)


def test_ring_never_hands_out_live_bytes():
    r = FifoRing(1000)
    live: dict[int, tuple[int, int]] = {}
    sizes = [137, 400, 3, 999, 250, 250, 250, 512, 1, 77] * 20
    acked = -1
    for n in sizes:
        got = r.place(n)
        while got is None:  # the reader catches up, one batch at a time
            acked += 1
            r.ack(acked)
            live.pop(acked, None)
            got = r.place(n)
        seq, off = got
        assert 0 <= off and off + n <= 1000
        for o, m in live.values():
            assert off + n <= o or o + m <= off, "a batch overlaps one not yet acknowledged"
        live[seq] = (off, n)


def test_ring_refuses_a_batch_larger_than_itself():
    with pytest.raises(ValueError, match="does not fit"):
        FifoRing(10).place(11)


def test_packed_reads_stage_back_to_back_and_split_big_chunks():
    wrs, total = packed_reads([(100, 10), (0, 5), (200, 2500)], remote_addr=1 << 20, remote_len=4096, max_bytes=1000)
    assert total == 2515
    assert [(w.local_off, w.remote_addr - (1 << 20), w.length) for w in wrs] == [
        (0, 100, 10), (10, 0, 5), (15, 200, 1000), (1015, 1200, 1000), (2015, 2200, 500)]
    assert [w.wr_id for w in wrs] == list(range(5))


def test_packed_reads_refuse_a_placement_outside_the_window():
    with pytest.raises(ValueError, match="outside the upstream's window"):
        packed_reads([(4000, 200)], remote_addr=4096, remote_len=4096)
    with pytest.raises(ValueError, match="outside"):
        packed_reads([(-1, 2)], remote_addr=4096, remote_len=4096)


def test_transport_setting_names_the_key_and_choices(monkeypatch):
    monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    assert transport_from_env() is ChunkTransport.AUTO
    monkeypatch.setenv(TRANSPORT_ENV, "RDMA")
    assert transport_from_env() is ChunkTransport.RDMA
    monkeypatch.setenv(TRANSPORT_ENV, "infiniband")
    with pytest.raises(ValueError, match=f"{TRANSPORT_ENV}='infiniband': use one of 'auto', 'tcp', 'rdma', 'cma'"):
        transport_from_env()
