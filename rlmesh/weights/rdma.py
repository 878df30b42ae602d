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
import os
import random
import time
from typing import Any

from rlmesh.weights.base import Fetched
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import plan_chunks
from rlmesh.weights.rdma_plan import (DEPTH, GID_INDEX_ENV, PORT_ENV, QPInfo, ReadWR, available, plan_reads,
                                      region_of)
from rlmesh.weights.tcp import Control

__all__ = ["PublisherSide", "QPInfo", "RdmaReader", "available", "plan_reads", "region_of"]

logger = logging.getLogger(__name__)

class _Endpoint:
    """A device context, a PD and the port facts both sides need."""

    def __init__(self) -> None:
        from pyverbs.device import Context  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.pd import PD  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        ok, dev = available()
        if not ok:
            raise WeightSyncError(dev)
        self.dev = dev
        self.ctx = Context(name=dev)
        self.pd = PD(self.ctx)
        self.port = int(os.environ.get(PORT_ENV, "1"))
        self.gid_index = int(os.environ.get(GID_INDEX_ENV, "0"))
        pa = self.ctx.query_port(self.port)
        self.lid, self.mtu = int(pa.lid), int(pa.active_mtu)
        self.gid = str(self.ctx.query_gid(self.port, self.gid_index).gid)
        self.rd_atom = max(1, min(DEPTH, int(self.ctx.query_device().max_qp_rd_atom)))

    def new_qp(self) -> tuple[Any, Any, QPInfo]:
        import pyverbs.enums as e  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.cq import CQ  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.qp import QP, QPCap, QPInitAttr  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        cq = CQ(self.ctx, DEPTH * 2)
        cap = QPCap(max_send_wr=DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0))
        info = QPInfo(qp.qp_num, random.getrandbits(24), self.lid, self.gid, self.port, self.gid_index, self.mtu)
        return qp, cq, info

    def connect(self, qp: Any, local: QPInfo, remote: QPInfo) -> None:
        """RESET -> INIT -> RTR -> RTS against ``remote`` (both sides do this with each other's info)."""
        import pyverbs.enums as e  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.addr import GID, AHAttr, GlobalRoute  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.qp import QPAttr  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        attr = QPAttr()
        attr.port_num = local.port
        attr.pkey_index = 0
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
        qp.to_init(attr)
        gid = GID()
        gid.gid = remote.gid
        gr = GlobalRoute(dgid=gid, sgid_index=local.gid_index, hop_limit=64)
        attr.ah_attr = AHAttr(port_num=local.port, dlid=remote.lid, is_global=int(remote.is_global), gr=gr)
        attr.path_mtu = min(local.mtu, remote.mtu)
        attr.dest_qp_num, attr.rq_psn = remote.qpn, remote.psn
        attr.max_dest_rd_atomic, attr.min_rnr_timer = self.rd_atom, 12
        qp.to_rtr(attr)
        attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry = local.psn, 14, 7, 7
        attr.max_rd_atomic = self.rd_atom
        qp.to_rts(attr)

    def register(self, addr: int, length: int, remote: bool) -> Any:
        import pyverbs.enums as e  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.mr import MR  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        access = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_REMOTE_READ if remote else 0)
        return MR(self.pd, length, access, address=addr)


class PublisherSide:
    """The publisher's half: registers slot data regions and answers ``rdma_connect``."""

    def __init__(self, name: str):
        self.name = name
        self.ep = _Endpoint()
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
        self.ep.pd.close()
        self.ep.ctx.close()


class RdmaReader(Control):
    """Reads versions with RDMA READs into a registered staging region."""

    name = "rdma"

    def __init__(self, record: dict[str, Any]):
        super().__init__(record)
        self.ep = _Endpoint()
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
        import pyverbs.enums as e  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.wr import SGE, SendWR  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        base = self._staging.data_ptr()
        deadline = time.monotonic() + timeout
        nxt, done, inflight = 0, 0, 0
        while done < len(wrs):
            while nxt < len(wrs) and inflight < self.ep.rd_atom:
                w = wrs[nxt]
                wr = SendWR(wr_id=w.wr_id, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                            sg=[SGE(base + w.local_off, w.length, self._mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
                wr.set_wr_rdma(rkey, w.remote_addr)
                self.qp.post_send(wr)
                nxt, inflight = nxt + 1, inflight + 1
            n, wcs = self.cq.poll(num_entries=DEPTH)
            for wc in wcs[:n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise WeightSyncError(f"RDMA READ {wc.wr_id} failed with status {wc.status} (vendor {wc.vendor_err})")
            done, inflight = done + n, inflight - n
            if n == 0 and time.monotonic() > deadline:
                raise WeightSyncError(f"RDMA READs from {self.pub_name!r} did not complete within {timeout:.0f}s")

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
        self.ep.pd.close()
        self.ep.ctx.close()
        super().close()
