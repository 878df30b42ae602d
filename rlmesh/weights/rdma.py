"""Cross-host reader over RDMA READ, through ``pyverbs`` (rdma-core's Python bindings).

Why RDMA READ: the publisher registers each slot's data region once as a memory
region with remote-read access; a reader then pulls the bytes with one-sided READs
over a reliable-connected queue pair, so the publisher's CPU does no per-byte work.
The QP info (QPN, PSN, LID, GID, MTU) is swapped over the publisher's authenticated
control channel, whose address the reader found through the runtime's directory;
each ``open`` reply carries the slot's ``(addr, rkey, length)``. READs land in a
registered staging region, are verified there, then copied into the target.

The planning helpers live in :mod:`rlmesh.weights.rdma_plan` (pure, unit-tested
without a device); everything here needs a device and sits behind
:func:`~rlmesh.weights.rdma_plan.available`, which states why when there is none.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rlmesh.transport.rdma_verbs import RdmaError, VerbsEndpoint
from rlmesh.weights.base import Fetched
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import plan_chunks
from rlmesh.weights.rdma_plan import QPInfo, ReadWR, available, plan_reads, region_of
from rlmesh.weights.tcp import Control

__all__ = ["PublisherSide", "QPInfo", "RdmaReader", "available", "plan_reads", "region_of"]

logger = logging.getLogger(__name__)


def _open_endpoint() -> VerbsEndpoint:
    """The device endpoint, its failure raised as weight sync's own error (callers fall back to tcp on it)."""
    try:
        return VerbsEndpoint()
    except RdmaError as exc:
        raise WeightSyncError(str(exc)) from exc


class PublisherSide:
    """The publisher's half: registers slot data regions and answers ``rdma_connect``."""

    def __init__(self, name: str):
        self.name = name
        self.ep = _open_endpoint()
        self._mrs: dict[int, Any] = {}  # id(slot) -> MR
        self._peers: list[tuple[Any, Any]] = []

    @classmethod
    def maybe_open(cls, name: str) -> "PublisherSide | None":
        ok, why = available()
        if not ok:
            logger.info("weights %r: no RDMA for remote readers (%s); they will use tcp", name, why)
            return None
        try:
            return cls(name)
        except Exception as exc:
            logger.warning("weights %r: RDMA device %s failed to open (%s); remote readers will use tcp", name, why, exc)
            return None

    def describe(self) -> dict[str, Any]:
        return {"device": self.ep.dev, "port": self.ep.port}

    def region(self, slot: Any) -> dict[str, int]:
        mr = self._mrs.get(id(slot))
        if mr is None:
            view = slot.data_view()
            mr = self._mrs[id(slot)] = self.ep.register(view.data_ptr(), slot.data_cap, remote=True)
            slot.extra["rdma_view"] = view  # keeps the exported mapping alive as long as the MR
        return region_of(slot.extra["rdma_view"].data_ptr(), slot.data_cap, int(mr.rkey))

    def connect(self, reader_qp: dict[str, Any], slots: list[Any]) -> dict[str, Any]:
        remote = QPInfo.from_json(reader_qp)
        qp, cq, local = self.ep.new_qp()
        self.ep.connect(qp, local, remote)
        self._peers.append((qp, cq))
        return local.to_json()

    def forget(self, slot: Any) -> None:
        mr = self._mrs.pop(id(slot), None)
        if mr is not None:
            mr.close()
        slot.extra.pop("rdma_view", None)

    def close(self) -> None:
        for qp, cq in self._peers:
            qp.close()
            cq.close()
        for mr in self._mrs.values():
            mr.close()
        self._mrs.clear()
        self.ep.close()


class RdmaReader(Control):
    """Reads versions with RDMA READs into a registered staging region."""

    name = "rdma"

    def __init__(self, record: dict[str, Any]):
        super().__init__(record)
        self.ep = _open_endpoint()
        self.qp, self.cq, self.info = self.ep.new_qp()
        reply, _ = self.call({"op": "rdma_connect", "qp": self.info.to_json()}, 30.0)
        if not reply.get("ok"):
            raise WeightSyncError(f"publisher of {self.pub_name!r} refused RDMA: {reply.get('error')}")
        self.ep.connect(self.qp, self.info, QPInfo.from_json(reply["qp"]))
        self._staging: Any = None
        self._mr: Any = None

    def _stage(self, nbytes: int) -> Any:
        import torch  # deferred: torch is heavy; weights of numpy arrays never load it

        if self._staging is None or self._staging.numel() < nbytes:
            if self._mr is not None:
                self._mr.close()
            self._staging = torch.empty(nbytes, dtype=torch.uint8)
            self._mr = self.ep.register(self._staging.data_ptr(), nbytes, remote=False)
        return self._staging

    def _read(self, wrs: list[ReadWR], rkey: int, timeout: float) -> None:
        try:
            self.ep.read(self.qp, self.cq, self._mr.lkey, self._staging.data_ptr(), wrs, rkey, timeout,
                         f"the publisher of {self.pub_name!r}")
        except RdmaError as exc:
            raise WeightSyncError(str(exc)) from exc

    def fetch(self, min_version: int, version: int | None, timeout: float) -> Fetched | None:
        t0 = time.perf_counter()
        opened = self.open(min_version, version, timeout, want=("rdma",))
        if opened is None:
            return None
        lease, manifest, extra = opened
        try:
            region = extra.get("rdma")
            if not region:
                raise WeightSyncError(f"publisher of {self.pub_name!r} sent no RDMA region for version {manifest.version}")
            chunks, pieces = plan_chunks(manifest, 64 << 20)
            staging = self._stage(manifest.total)
            self._read(plan_reads(chunks, int(region["addr"]), int(region["length"])), int(region["rkey"]), timeout)
            sources = [[staging[chunks[p.chunk][0] + p.start : chunks[p.chunk][0] + p.start + p.length] for p in ps]
                       for ps in pieces]
        except BaseException:
            self.release(lease)
            raise
        return Fetched(manifest, sources, lambda: self.release(lease), time.perf_counter() - t0)

    def close(self) -> None:
        for obj in (self.qp, self.cq, self._mr):
            if obj is not None:
                obj.close()
        self.ep.close()
        super().close()
