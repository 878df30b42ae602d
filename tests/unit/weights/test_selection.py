"""Transport choice per reader, and the one log line when RDMA falls back to TCP."""

import logging

import pytest

from rlmesh.weights import rdma_plan
from rlmesh.weights.errors import TransportUnavailableError
from rlmesh.weights.selection import select_transport


@pytest.fixture
def rec(tmp_path):
    ctl = tmp_path / "x.ctl"
    ctl.write_text("{}")
    return {"name": "p", "host": "hostA", "ctl": str(ctl), "tcp": "tcp://127.0.0.1:1", "rdma": {"device": "mlx5_0"},
            "cuda-ipc": True}


@pytest.fixture
def no_rdma(monkeypatch):
    monkeypatch.setattr(rdma_plan, "available", lambda: (False, "pyverbs found no RDMA device (test)"))


@pytest.fixture
def has_rdma(monkeypatch):
    monkeypatch.setattr(rdma_plan, "available", lambda: (True, "mlx5_0"))


def test_same_host_prefers_shm_and_cuda_for_gpu_targets(rec):
    assert select_transport(rec, None, False, "hostA")[0] == "shm"
    assert select_transport(rec, None, True, "hostA")[0] == "cuda-ipc"
    assert select_transport({**rec, "cuda-ipc": False}, None, True, "hostA")[0] == "shm"


def test_same_host_name_without_the_segment_is_remote(rec, no_rdma):
    """Two pods can share a hostname pattern but not /dev/shm: the ctl file must be visible."""
    assert select_transport({**rec, "ctl": "/nonexistent/x.ctl"}, None, False, "hostA")[0] == "tcp"


def test_other_host_uses_rdma_when_both_sides_have_it(rec, has_rdma):
    assert select_transport(rec, None, False, "hostB") == ("rdma", "other host, RDMA device on both sides")


def test_other_host_falls_back_to_tcp_and_says_why(rec, no_rdma):
    kind, why = select_transport(rec, None, False, "hostB")
    assert kind == "tcp" and "no RDMA device (test)" in why
    assert select_transport({**rec, "rdma": None}, None, False, "hostB")[0] == "tcp"


def test_forced_transports_fail_with_the_fix(rec, no_rdma):
    with pytest.raises(TransportUnavailableError, match="use 'tcp'"):
        select_transport(rec, "rdma", False, "hostB")
    with pytest.raises(TransportUnavailableError, match="needs the publisher on this host"):
        select_transport(rec, "shm", False, "hostB")
    with pytest.raises(ValueError, match="not one of"):
        select_transport(rec, "udp", False, "hostB")
    assert select_transport(rec, "tcp", False, "hostA") == ("tcp", "forced")


def test_fallback_is_logged_once(rec, no_rdma, monkeypatch, caplog):
    from rlmesh.actor.kv import LocalKV
    from rlmesh.weights import subscriber as sub_mod

    d = LocalKV()
    d.put("rlmesh/weights/p", {**rec, "host": "elsewhere"})
    made = []
    monkeypatch.setattr(sub_mod.Subscriber, "_make", staticmethod(lambda kind, r: made.append(kind) or _Fake(kind)))
    s = sub_mod.Subscriber("p", directory=d)
    with caplog.at_level(logging.INFO, logger="rlmesh.weights.subscriber"):
        for _ in range(3):
            s.latest_version()
    lines = [r.getMessage() for r in caplog.records if "reading over" in r.getMessage()]
    assert made == ["tcp"]
    assert lines == ["weights 'p': reading over tcp (other host; rdma unavailable here: pyverbs found no RDMA device (test))"]


class _Fake:
    def __init__(self, name):
        self.name = name

    def versions(self):
        return [3]

    def close(self):
        pass
