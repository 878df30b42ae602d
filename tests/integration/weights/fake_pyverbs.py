"""An in-process stand-in for ``pyverbs`` that enforces the verbs rules rlmesh's RDMA code must follow.

Why: this machine has no RDMA device, so the real verbs path cannot run here. This
fake runs the *same* calls and checks what a device would: QPs walk RESET -> INIT ->
RTR -> RTS, an RC READ needs both QPs connected to each other (dest_qp_num), the
remote region's rkey and REMOTE_READ access, the local region's lkey and
LOCAL_WRITE access, and every address inside its region; a READ is a memmove from
the remote address. It proves the call sequence and data path, not the hardware.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import types

IBV_QPT_RC, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, IBV_WC_SUCCESS = 2, 4, 2, 0
IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ = 1, 2, 4
IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS = 0, 1, 2, 3
_keys = itertools.count(0x100)
_qpns = itertools.count(0x40)
MRS: dict[int, "MR"] = {}
QPS: dict[int, "QP"] = {}
stats = {"reads": 0, "bytes": 0}


class PyverbsRDMAError(Exception):
    pass


class _Dev:
    name = b"fake_rxe0"


def get_device_list():
    return [_Dev()]


class _Attr:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Context:
    def __init__(self, name=None):
        assert name == "fake_rxe0", name

    def query_port(self, port):
        assert port == 1
        return _Attr(lid=7, active_mtu=5)

    def query_gid(self, port, index):
        return _Attr(gid="fe80:0000:0000:0000:0000:0000:0000:0001")

    def query_device(self):
        return _Attr(max_qp_rd_atom=16)

    def close(self):
        pass


class PD:
    def __init__(self, ctx):
        assert isinstance(ctx, Context)

    def close(self):
        pass


class MR:
    def __init__(self, pd, length, access, address=None):
        assert isinstance(pd, PD) and address and length > 0
        self.addr, self.length, self.access = address, length, access
        self.lkey = self.rkey = next(_keys)
        MRS[self.lkey] = self

    def close(self):
        MRS.pop(self.lkey, None)


class WC:
    def __init__(self, wr_id, status):
        self.wr_id, self.status, self.vendor_err = wr_id, status, 0


class CQ:
    def __init__(self, ctx, cqe):
        self.done: list[WC] = []

    def poll(self, num_entries=1):
        out, self.done = self.done[:num_entries], self.done[num_entries:]
        return len(out), out

    def close(self):
        pass


class QPCap:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class QPInitAttr:
    def __init__(self, qp_type, scq, rcq, cap, sq_sig_all=0):
        assert qp_type == IBV_QPT_RC
        self.scq, self.cap = scq, cap


class QPAttr:
    pass


class GID:
    gid = "0000:0000:0000:0000:0000:0000:0000:0000"


class GlobalRoute:
    def __init__(self, dgid, sgid_index=0, hop_limit=1):
        self.dgid = dgid


class AHAttr:
    def __init__(self, port_num, dlid, is_global, gr):
        self.port_num, self.dlid, self.is_global, self.gr = port_num, dlid, is_global, gr


class QP:
    def __init__(self, pd, init):
        self.qp_num, self.cq, self.state, self.cap = next(_qpns), init.scq, IBV_QPS_RESET, init.cap
        QPS[self.qp_num] = self

    def to_init(self, attr):
        assert self.state == IBV_QPS_RESET and attr.port_num == 1
        self.access = attr.qp_access_flags
        self.state = IBV_QPS_INIT

    def to_rtr(self, attr):
        assert self.state == IBV_QPS_INIT
        assert attr.dest_qp_num in QPS and attr.ah_attr.dlid == 7 and attr.path_mtu == 5
        self.dest = attr.dest_qp_num
        self.state = IBV_QPS_RTR

    def to_rts(self, attr):
        assert self.state == IBV_QPS_RTR and attr.max_rd_atomic >= 1
        self.state = IBV_QPS_RTS

    def post_send(self, wr):
        assert self.state == IBV_QPS_RTS, "post_send before RTS"
        peer = QPS[self.dest]
        assert peer.dest == self.qp_num and peer.state >= IBV_QPS_RTR, "peer QP not connected to us"
        assert peer.access & IBV_ACCESS_REMOTE_READ, "responder QP does not allow remote reads"
        assert wr.opcode == IBV_WR_RDMA_READ and wr.send_flags & IBV_SEND_SIGNALED
        sge = wr.sg[0]
        local, remote = MRS[sge.lkey], MRS[wr.rkey]
        assert local.access & IBV_ACCESS_LOCAL_WRITE and remote.access & IBV_ACCESS_REMOTE_READ
        assert local.addr <= sge.addr and sge.addr + sge.length <= local.addr + local.length, "local out of MR"
        assert remote.addr <= wr.remote_addr and wr.remote_addr + sge.length <= remote.addr + remote.length
        ctypes.memmove(sge.addr, wr.remote_addr, sge.length)
        stats["reads"] += 1
        stats["bytes"] += sge.length
        self.cq.done.append(WC(wr.wr_id, IBV_WC_SUCCESS))

    def close(self):
        QPS.pop(self.qp_num, None)


class SGE:
    def __init__(self, addr, length, lkey):
        self.addr, self.length, self.lkey = addr, length, lkey


class SendWR:
    def __init__(self, wr_id, opcode, num_sge, sg, send_flags):
        assert num_sge == len(sg) == 1
        self.wr_id, self.opcode, self.sg, self.send_flags = wr_id, opcode, sg, send_flags

    def set_wr_rdma(self, rkey, addr):
        self.rkey, self.remote_addr = rkey, addr


def install(monkeypatch) -> None:
    """Put this module in place of every ``pyverbs.*`` import for one test."""
    me = sys.modules[__name__]
    pkg = types.ModuleType("pyverbs")
    for sub in ("device", "pd", "mr", "cq", "qp", "addr", "wr", "enums"):
        monkeypatch.setitem(sys.modules, f"pyverbs.{sub}", me)
        setattr(pkg, sub, me)
    monkeypatch.setitem(sys.modules, "pyverbs", pkg)
