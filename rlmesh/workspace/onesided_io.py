"""One-sided chunk transfer: the upstream's window and the downstream's puller, over RDMA or CMA.

:class:`Window` (upstream, one per downstream peer) is an anonymous mapping that batches of
chunks are copied into; :class:`Puller` (downstream) READs a batch out of it into its own staging
mapping. Two ways to READ, one protocol (:mod:`rlmesh.workspace.onesided`):

- ``rdma``: an RC queue pair per peer; the window is a memory region with remote read access,
  its ``(addr, rkey)`` sent over the authenticated channel, and READs are posted with
  :class:`~rlmesh.transport.rdma_verbs.VerbsEndpoint` (as weight sync does).
- ``cma``: ``process_vm_readv(2)`` from the upstream's pid, for processes on one machine only:
  the window names its boot id and pid namespace, and a puller elsewhere refuses it.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from typing import Any

from rlmesh.transport.rdma_plan import QPInfo, available, region_of
from rlmesh.transport.rdma_verbs import RdmaError, VerbsEndpoint
from rlmesh.workspace.onesided import RING_BYTES, ChunkTransport, FifoRing, packed_reads

logger = logging.getLogger(__name__)

READ_TIMEOUT_S = 60.0


class OneSidedError(RuntimeError):
    """A window or puller could not be set up, or a READ failed; the link falls back to TCP."""


def _machine() -> str:
    """This machine and pid namespace: CMA reads another pid only where both name the same."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError as exc:
        raise OneSidedError(f"cma needs /proc (boot id, pid namespace): {exc}") from exc


class _Mapping:
    """An anonymous mapping and its address (for a memory region or an iovec)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.map = mmap.mmap(-1, size)
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(self._anchor)

    def close(self) -> None:
        del self._anchor  # the export must go before the mapping can close
        try:
            self.map.close()
        except BufferError:  # a caller still holds a view of it: the mapping goes with the last one
            pass


class Window:
    """The upstream's side for one downstream peer: batches go into a FIFO ring until acknowledged."""

    kind: ChunkTransport

    def __init__(self, capacity: int = RING_BYTES) -> None:
        self.ring = FifoRing(capacity)
        self.mem = _Mapping(capacity)

    def place(self, datas: list[bytes | memoryview]) -> tuple[int, list[tuple[int, int]]] | None:
        """Copy a batch in; ``(seq, [(offset, length)...])``, or ``None`` while the ring is full."""
        total = sum(len(d) for d in datas)
        got = self.ring.place(total)
        if got is None:
            return None
        seq, off = got
        at = []
        for d in datas:
            self.mem.map[off:off + len(d)] = d
            at.append((off, len(d)))
            off += len(d)
        return seq, at

    def ack(self, seq: int) -> int:
        return self.ring.ack(seq)

    def describe(self) -> dict[str, Any]:
        """What the puller needs to READ this window (sent back on the authenticated channel)."""
        raise NotImplementedError

    def close(self) -> None:
        self.mem.close()


class CmaWindow(Window):
    kind = ChunkTransport.CMA

    def __init__(self, capacity: int = RING_BYTES) -> None:
        self.machine = _machine()
        super().__init__(capacity)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "machine": self.machine, "pid": os.getpid(),
                "addr": self.mem.addr, "length": self.mem.size}


class RdmaWindow(Window):
    """An RC queue pair connected to the puller's, and the ring registered for remote READ."""

    kind = ChunkTransport.RDMA

    def __init__(self, peer_qp: dict[str, Any], capacity: int = RING_BYTES) -> None:
        super().__init__(capacity)
        self.ep = VerbsEndpoint()
        self.qp, self.cq, self.info = self.ep.new_qp()
        self.ep.connect(self.qp, self.info, QPInfo.from_json(peer_qp))
        self.mr = self.ep.register(self.mem.addr, self.mem.size, remote=True)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "qp": self.info.to_json(),
                "region": region_of(self.mem.addr, self.mem.size, int(self.mr.rkey))}

    def close(self) -> None:
        for obj in (self.qp, self.cq, self.mr):
            obj.close()
        self.ep.close()
        super().close()


def open_window(request: dict[str, Any]) -> Window:
    """The window a downstream peer asked for (``request["kind"]``); :class:`OneSidedError` says why not."""
    kind = request.get("kind")
    try:
        if kind == ChunkTransport.CMA.value:
            return CmaWindow()
        if kind == ChunkTransport.RDMA.value:
            ok, why = available()
            if not ok:
                raise OneSidedError(f"the upstream has no RDMA device: {why}")
            return RdmaWindow(request["qp"])
    except OneSidedError:
        raise
    except Exception as exc:
        raise OneSidedError(f"{kind} window failed: {type(exc).__name__}: {exc}") from exc
    raise OneSidedError(f"unknown one-sided transport {kind!r}")


class Puller:
    """The downstream's side: READs a placed batch into its staging mapping."""

    kind: ChunkTransport

    def __init__(self) -> None:
        self.staging: _Mapping | None = None

    def request(self) -> dict[str, Any]:
        """What the upstream needs to open a window for us."""
        return {"kind": self.kind.value}

    def attach(self, window: dict[str, Any]) -> None:
        """Take the upstream's :meth:`Window.describe`; :class:`OneSidedError` if unusable here."""
        raise NotImplementedError

    def _stage(self, n: int) -> _Mapping:
        if self.staging is None or self.staging.size < n:
            if self.staging is not None:
                self._drop_staging()
            self.staging = _Mapping(max(n, RING_BYTES))
            self._staged()
        return self.staging

    def _staged(self) -> None:
        """A new staging mapping exists (RDMA registers it)."""

    def _drop_staging(self) -> None:
        self.staging.close()  # type: ignore[union-attr]  # open while the window is
        self.staging = None

    def read(self, at: list[tuple[int, int]]) -> list[memoryview]:
        """The placed chunks, as views of the staging mapping (valid until the next read)."""
        raise NotImplementedError

    def _views(self, at: list[tuple[int, int]]) -> list[memoryview]:
        whole = memoryview(self.staging.map)  # type: ignore[union-attr]  # open while the window is
        out, pos = [], 0
        for _, n in at:
            out.append(whole[pos:pos + n])
            pos += n
        return out

    def close(self) -> None:
        if self.staging is not None:
            self._drop_staging()


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


IOV_MAX = 1024


class CmaPuller(Puller):
    kind = ChunkTransport.CMA

    def __init__(self) -> None:
        super().__init__()
        self.machine = _machine()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.process_vm_readv.restype = ctypes.c_ssize_t
        self.pid = self.addr = self.length = 0

    def attach(self, window: dict[str, Any]) -> None:
        if window.get("machine") != self.machine:
            raise OneSidedError("cma: the upstream is on another machine or pid namespace")
        self.pid, self.addr, self.length = int(window["pid"]), int(window["addr"]), int(window["length"])

    def read(self, at: list[tuple[int, int]]) -> list[memoryview]:
        wrs, total = packed_reads(at, self.addr, self.length)
        stage = self._stage(total)
        for i in range(0, len(wrs), IOV_MAX):
            part = wrs[i:i + IOV_MAX]
            want = sum(w.length for w in part)
            local = _Iovec(stage.addr + part[0].local_off, want)  # packed: one local span
            remote = (_Iovec * len(part))(*[_Iovec(w.remote_addr, w.length) for w in part])
            got = self._libc.process_vm_readv(self.pid, ctypes.byref(local), 1, remote, len(part), 0)
            if got != want:
                err = ctypes.get_errno()
                raise OneSidedError(f"cma: read {got} of {want} bytes from pid {self.pid}: {os.strerror(err)}")
        return self._views(at)


class RdmaPuller(Puller):
    kind = ChunkTransport.RDMA

    def __init__(self) -> None:
        super().__init__()
        self.ep = VerbsEndpoint()
        self.qp, self.cq, self.info = self.ep.new_qp()
        self.mr: Any = None
        self.region: dict[str, int] = {}

    def request(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "qp": self.info.to_json()}

    def attach(self, window: dict[str, Any]) -> None:
        self.ep.connect(self.qp, self.info, QPInfo.from_json(window["qp"]))
        r = window["region"]
        self.region = region_of(int(r["addr"]), int(r["length"]), int(r["rkey"]))

    def _staged(self) -> None:
        self.mr = self.ep.register(self.staging.addr, self.staging.size, remote=False)  # type: ignore[union-attr]  # open while the window is

    def _drop_staging(self) -> None:
        if self.mr is not None:
            self.mr.close()
            self.mr = None
        super()._drop_staging()

    def read(self, at: list[tuple[int, int]]) -> list[memoryview]:
        wrs, total = packed_reads(at, self.region["addr"], self.region["length"])
        stage = self._stage(total)
        try:
            self.ep.read(self.qp, self.cq, self.mr.lkey, stage.addr, wrs, self.region["rkey"], READ_TIMEOUT_S,
                         "the upstream host")
        except RdmaError as exc:
            raise OneSidedError(str(exc)) from exc
        return self._views(at)

    def close(self) -> None:
        super().close()
        self.qp.close()
        self.cq.close()
        self.ep.close()


def new_puller(mode: ChunkTransport) -> Puller | None:
    """The puller this host uses toward its upstream, or ``None`` for TCP (no device, or ``tcp``)."""
    if mode == ChunkTransport.TCP:
        return None
    if mode == ChunkTransport.CMA:
        return CmaPuller()
    ok, why = available()
    if not ok:
        if mode == ChunkTransport.RDMA:
            logger.warning("workspace sync: RDMA asked for but %s; chunks come over TCP", why)
        return None
    try:
        return RdmaPuller()
    except Exception as exc:
        logger.warning("workspace sync: RDMA device %s failed to open (%s); chunks come over TCP", why, exc)
        return None
