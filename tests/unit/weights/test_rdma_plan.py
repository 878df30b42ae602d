"""RDMA logic that needs no device: QP info exchange format, READ plans, region descriptors, probing."""

import json

import pytest
import torch

from rlmesh.weights import rdma_plan
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import plan_chunks, plan_layout
from rlmesh.weights.rdma_plan import QPInfo, plan_reads, region_of

GID = "fe80:0000:0000:0000:0202:c9ff:fe00:0001"


def test_qpinfo_roundtrips_through_json_as_the_control_channel_carries_it():
    q = QPInfo(qpn=0x1234, psn=0xABCDE, lid=7, gid=GID, port=1, gid_index=3, mtu=5)
    assert QPInfo.from_json(json.loads(json.dumps(q.to_json()))) == q
    assert q.is_global
    assert not QPInfo(1, 1, 1, "0000:" * 7 + "0000", 1, 0, 3).is_global  # IB with LID only


@pytest.mark.parametrize("field,value", [("qpn", 1 << 24), ("psn", -1), ("lid", 1 << 16), ("mtu", 9),
                                         ("gid", "fe80::1"), ("gid", "zz00:" * 7 + "0000")])
def test_qpinfo_rejects_values_the_verbs_would_truncate(field, value):
    kw = dict(qpn=1, psn=2, lid=3, gid=GID, port=1, gid_index=0, mtu=3)
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        QPInfo(**kw)


def test_reads_cover_chunks_within_max_size_and_map_remote_addresses():
    sd = {"big": torch.zeros(3 << 20, dtype=torch.uint8), "small": torch.zeros(100), "b2": torch.zeros(10, dtype=torch.uint8)}
    m = plan_layout("p", 1, sd)
    chunks, _ = plan_chunks(m, 64 << 20)
    wrs = plan_reads(chunks, remote_addr=0x7F0000000000, remote_len=m.total, max_bytes=1 << 20)
    assert [w.wr_id for w in wrs] == list(range(len(wrs)))
    assert all(0 < w.length <= 1 << 20 for w in wrs)
    assert all(w.remote_addr == 0x7F0000000000 + w.local_off for w in wrs)
    covered = sorted((w.local_off, w.local_off + w.length) for w in wrs)
    assert covered[0][0] == 0 and covered[-1][1] == sum(n for _, n in chunks) + chunks[0][0]
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # one chunk here: contiguous


def test_reads_refuse_ranges_outside_the_remote_region():
    with pytest.raises(WeightSyncError, match="outside"):
        plan_reads([(0, 4096)], remote_addr=1 << 20, remote_len=1000)


def test_region_descriptor_validates():
    assert region_of(4096, 10, 77) == {"addr": 4096, "length": 10, "rkey": 77}
    with pytest.raises(ValueError):
        region_of(0, 10, 1)
    with pytest.raises(ValueError):
        region_of(4096, 10, 1 << 32)


def test_probe_states_why_there_is_no_device():
    rdma_plan.available.cache_clear()
    try:
        ok, why = rdma_plan.available()
    finally:
        rdma_plan.available.cache_clear()
    if ok:
        pytest.skip(f"this machine has an RDMA device ({why})")
    assert "pyverbs" in why and ("no RDMA device" in why or "not importable" in why)


def test_cuda_ipc_handles_survive_the_json_control_channel():
    from rlmesh.weights.cuda_ipc import _decode, _encode

    handle = (0, b"\x01\x02ipc", 4096, 0, b"/torch_123", 8, b"\x00ev", True)
    assert _decode(json.loads(json.dumps(_encode(handle)))) == handle
