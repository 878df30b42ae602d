"""Every transport passes the same suite (see suite.py)."""

import pytest

from rlmesh.weights import rdma_plan
from suite import TransportSuite


class TestShm(TransportSuite):
    transport = "shm"


class TestTcp(TransportSuite):
    transport = "tcp"


_rdma_ok, _rdma_why = rdma_plan.available()


@pytest.mark.rdma
@pytest.mark.skipif(not _rdma_ok, reason=f"needs an RDMA device: {_rdma_why}")
class TestRdma(TransportSuite):
    transport = "rdma"


class TestRdmaEmulatedVerbs(TransportSuite):
    """The RDMA transport's real code over ``fake_pyverbs`` (which checks the verbs rules; no hardware)."""

    transport = "rdma"

    @pytest.fixture
    def transport_setup(self, monkeypatch):
        import fake_pyverbs

        fake_pyverbs.install(monkeypatch)
        rdma_plan.available.cache_clear()
        yield
        rdma_plan.available.cache_clear()

    def test_bytes_arrive_by_rdma_read_in_bounded_work_requests(self, env):
        import fake_pyverbs
        import torch

        pub, sub = env
        before = dict(fake_pyverbs.stats)
        pub.publish({"big": torch.randn(3 << 20), "small": torch.ones(5)}, version=1)
        out, v = sub.pull()
        reads = fake_pyverbs.stats["reads"] - before["reads"]
        moved = fake_pyverbs.stats["bytes"] - before["bytes"]
        assert v.stats.transport == "rdma" and torch.equal(out["small"], torch.ones(5))
        assert moved >= 12 << 20 and reads >= 12  # 1 MiB READs


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
class TestCudaIpc(TransportSuite):
    transport = "cuda-ipc"
    device = "cuda"
