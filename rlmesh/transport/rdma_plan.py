"""The device-independent half of RDMA: the device probe, queue-pair info and READ work requests.

Why in the transport layer: weight sync (:mod:`rlmesh.weights.rdma`) and workspace
distribution (:mod:`rlmesh.workspace.onesided_io`) both move bytes with one-sided READs;
this is what they share that can be checked without a device (unit-tested here, where
pyverbs imports but lists no device). The verbs calls are in :mod:`rlmesh.transport.rdma_verbs`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from rlmesh import settings

DEVICE_ENV, PORT_ENV, GID_INDEX_ENV = settings.RDMA_DEVICE.name, settings.RDMA_PORT.name, settings.RDMA_GID_INDEX.name
READ_BYTES = 1 << 20  # one READ work request
DEPTH = 16  # READs in flight per QP (also bounded by the device's max_qp_rd_atom)
INSTALL_HINT = "apt-get install python3-pyverbs, then scripts/setup_rdma.sh (see docs/weights.md)"


@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """``(True, device)`` when pyverbs imports and lists at least one RDMA device, else ``(False, why)``."""
    try:
        from pyverbs.device import get_device_list  # deferred: optional pyverbs (the rdma extra), loaded only with an RDMA device
    except ImportError as exc:
        return False, f"pyverbs is not importable ({exc}); {INSTALL_HINT}"
    try:
        devs = get_device_list()
    except Exception as exc:  # rdma-core raises when /sys/class/infiniband is absent
        return False, f"pyverbs found no RDMA device ({exc})"
    if not devs:
        return False, "pyverbs found no RDMA device (empty device list)"
    names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devs]
    want = settings.RDMA_DEVICE.get()
    if want and want not in names:
        return False, f"{DEVICE_ENV}={want} is not among the RDMA devices {names}"
    return True, want or names[0]


@dataclass(frozen=True)
class QPInfo:
    """What a peer needs to connect an RC queue pair to ours."""

    qpn: int
    psn: int
    lid: int
    gid: str
    port: int
    gid_index: int
    mtu: int

    def __post_init__(self) -> None:
        for f, bits in (("qpn", 24), ("psn", 24), ("lid", 16)):
            v = getattr(self, f)
            if not 0 <= v < (1 << bits):
                raise ValueError(f"QPInfo.{f}={v} does not fit {bits} bits")
        if self.mtu not in (1, 2, 3, 4, 5):
            raise ValueError(f"QPInfo.mtu={self.mtu} is not an ibv_mtu enum (1..5)")
        parts = self.gid.split(":")
        if len(parts) != 8 or not all(len(p) == 4 and all(c in "0123456789abcdefABCDEF" for c in p) for p in parts):
            raise ValueError(f"QPInfo.gid={self.gid!r} is not a 16-byte GID in 8 hex groups")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "QPInfo":
        return cls(int(d["qpn"]), int(d["psn"]), int(d["lid"]), str(d["gid"]), int(d["port"]), int(d["gid_index"]),
                   int(d["mtu"]))

    @property
    def is_global(self) -> bool:
        return self.gid != "0000:" * 7 + "0000"


@dataclass(frozen=True)
class ReadWR:
    """One RDMA READ: ``length`` bytes from ``remote_addr`` into the staging region at ``local_off``."""

    wr_id: int
    local_off: int
    remote_addr: int
    length: int


def append_reads(out: list[ReadWR], local_off: int, remote_addr: int, n: int, max_bytes: int = READ_BYTES) -> None:
    """Append READs of at most ``max_bytes`` that bring ``n`` bytes at ``remote_addr`` to ``local_off``
    of the local region (work request ids go on from ``len(out)``)."""
    pos = 0
    while pos < n:
        take = min(max_bytes, n - pos)
        out.append(ReadWR(len(out), local_off + pos, remote_addr + pos, take))
        pos += take


def region_of(addr: int, length: int, rkey: int) -> dict[str, int]:
    """How a reply describes a registered memory region to the peer that will READ it."""
    if addr <= 0 or length <= 0 or not 0 <= rkey < (1 << 32):
        raise ValueError(f"bad memory region addr={addr} length={length} rkey={rkey}")
    return {"addr": addr, "length": length, "rkey": rkey}
