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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
class TestCudaIpc(TransportSuite):
    transport = "cuda-ipc"
    device = "cuda"
