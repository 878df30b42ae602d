"""The verbs calls of RDMA (``pyverbs``): a device endpoint, RC queue pairs, memory regions, READs.

Why here: weight sync (:mod:`rlmesh.weights.rdma`) and workspace distribution
(:mod:`rlmesh.workspace.onesided_io`) both pull bytes with one-sided READs over an RC queue
pair whose peer info was swapped on an authenticated channel. Everything here needs a device;
the device probe and the pure planning are in :mod:`rlmesh.transport.rdma_plan`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from rlmesh import settings
from rlmesh.transport.rdma_plan import DEPTH, QPInfo, ReadWR, available


class RdmaError(RuntimeError):
    """The device could not be opened, or a READ failed or did not complete in time."""


class VerbsEndpoint:
    """A device context, a protection domain and the port facts both sides of a queue pair need."""

    def __init__(self) -> None:
        from pyverbs.device import Context  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.pd import PD  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        ok, dev = available()
        if not ok:
            raise RdmaError(dev)
        self.dev = dev
        self.ctx = Context(name=dev)
        self.pd = PD(self.ctx)
        self.port = settings.RDMA_PORT.get()
        self.gid_index = settings.RDMA_GID_INDEX.get()
        pa = self.ctx.query_port(self.port)
        self.lid, self.mtu = int(pa.lid), int(pa.active_mtu)
        self.gid = str(self.ctx.query_gid(self.port, self.gid_index).gid)
        self.rd_atom = max(1, min(DEPTH, int(self.ctx.query_device().max_qp_rd_atom)))

    def new_qp(self) -> tuple[Any, Any, QPInfo]:
        """An RC queue pair (RESET state), its completion queue, and the info its peer connects with."""
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
        """A memory region over ``[addr, addr + length)``; ``remote``: peers may READ it."""
        import pyverbs.enums as e  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.mr import MR  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        access = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_REMOTE_READ if remote else 0)
        return MR(self.pd, length, access, address=addr)

    def read(self, qp: Any, cq: Any, lkey: int, base: int, wrs: list[ReadWR], rkey: int, timeout: float,
             peer: str) -> None:
        """Post ``wrs`` as RDMA READs into the local region at ``base`` (``lkey``), at most ``rd_atom``
        in flight, and wait for all of them; :class:`RdmaError` names ``peer`` on a failure or timeout."""
        import pyverbs.enums as e  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
        from pyverbs.wr import SGE, SendWR  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device

        deadline = time.monotonic() + timeout
        nxt, done, inflight = 0, 0, 0
        while done < len(wrs):
            while nxt < len(wrs) and inflight < self.rd_atom:
                w = wrs[nxt]
                wr = SendWR(wr_id=w.wr_id, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                            sg=[SGE(base + w.local_off, w.length, lkey)], send_flags=e.IBV_SEND_SIGNALED)
                wr.set_wr_rdma(rkey, w.remote_addr)
                qp.post_send(wr)
                nxt, inflight = nxt + 1, inflight + 1
            n, wcs = cq.poll(num_entries=DEPTH)
            for wc in wcs[:n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise RdmaError(f"RDMA READ {wc.wr_id} from {peer} failed with status {wc.status} "
                                    f"(vendor {wc.vendor_err})")
            done, inflight = done + n, inflight - n
            if n == 0 and time.monotonic() > deadline:
                raise RdmaError(f"RDMA READs from {peer} did not complete within {timeout:.0f}s")

    def close(self) -> None:
        self.pd.close()
        self.ctx.close()
