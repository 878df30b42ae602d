"""Versions in POSIX shared memory: one file per slot under ``/dev/shm``, plus a small ``.ctl`` index.

Why slots and ``flock``: the publisher writes each version once, into host memory
that shm readers map directly and that the TCP/RDMA servers send from. A slot is
reused only when no reader holds it: readers take ``flock(LOCK_SH)`` while copying,
the publisher takes ``LOCK_EX|LOCK_NB`` before overwriting and, if that fails, writes
into another slot instead of waiting. So a slow reader finishes the version it
started, the publisher never blocks, and locks die with their process (no stale
pins after a crash).

Names: ``rlmesh-w-<job>-<proc>-<pid>-<name>-<token>-s<idx>`` and ``...-<token>.ctl``, so the
controller plugin can unlink everything a dead proc (or a whole job) left behind.
Each slot file: a 64-byte header (magic, state, version, gen, manifest/data offsets),
the JSON manifest of the version it holds, then the data at a page boundary.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import glob
import json
import logging
import mmap
import os
import struct
import sys
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from rlmesh import settings
from rlmesh.actor.pids import pid_running
from rlmesh.weights.directory import safe

logger = logging.getLogger(__name__)


@contextmanager
def quiet_readonly() -> Iterator[None]:
    """Views over received (read-only) zmq frames are only ever read; silence torch's warning about them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        yield




def default_shm_dir() -> str:
    """Where weight segments are made: ``RLMESH_SHM_DIR`` (``/dev/shm``), read at each call."""
    return settings.SHM_DIR.get()
PREFIX = "rlmesh-w-"
MAGIC = b"RLMWv001"
HEADER = struct.Struct("<8sQQQQQQQ")
EMPTY, WRITING, READY = 0, 1, 2
PAGE = mmap.PAGESIZE


POPULATE_CHUNK = 32 << 20
"""Bytes populated per step ahead of the first write: a publish that stops the populator waits for
at most one step (~15-60 ms on a loaded 2-core host)."""
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; older kernels answer EINVAL


def _page_up(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def chunk_ranges(start: int, end: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into ``(offset, length)`` steps of at most ``chunk`` bytes, in order."""
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0, got {chunk}")
    return [(off, min(chunk, end - off)) for off in range(start, end, chunk)]


class _Madvise:
    """``madvise(MADV_POPULATE_WRITE)`` through ctypes where the kernel has it, so a populator
    allocates and maps a range in one system call (the GIL released meanwhile) without writing a
    byte; ``ok`` turns False on the first refusal and the caller touches the pages instead."""

    def __init__(self) -> None:
        self.ok = sys.platform.startswith("linux")  # the advice number is Linux's
        self._fn: Any = None
        if self.ok:
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
            except (OSError, AttributeError):
                self.ok = False
                return
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
            self._fn = fn

    def populate(self, addr: int, length: int) -> bool:
        if not self.ok:
            return False
        if self._fn(addr, length, _MADV_POPULATE_WRITE) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS):
            self.ok = False  # an older kernel: touch pages from now on
            return False
        raise OSError(err, os.strerror(err))


_madvise = _Madvise()


def base_name(job: str, proc: str, pid: int, name: str) -> str:
    return f"{PREFIX}{safe(job)}-{safe(proc)}-{pid}-{safe(name)}"


@dataclass
class SlotHeader:
    state: int
    version: int
    gen: int
    manifest_off: int
    manifest_len: int
    data_off: int
    data_len: int

    @classmethod
    def read(cls, buf: Any) -> "SlotHeader":
        magic, *rest = HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise ValueError("not an rlmesh weight segment (bad magic)")
        return cls(*rest)


class SlotFile:
    """Publisher side of one slot: created, mapped read-write, locked exclusively while written."""

    def __init__(self, path: str, idx: int, data_cap: int, manifest_cap: int):
        self.path, self.idx = path, idx
        self.manifest_off = HEADER.size
        self.data_off = _page_up(HEADER.size + manifest_cap)
        self.data_cap = data_cap
        self.size = self.data_off + _page_up(max(data_cap, 1))
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            free = _free_bytes(self.fd)
            if free is not None and free < self.size:  # early and clear; the first write is the guarantee
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.ftruncate(self.fd, self.size)
            # Only the header and manifest pages are allocated now (they are written through the
            # mapping, where a full /dev/shm would SIGBUS). The data pages come with the first
            # version's write(), which fills them without the zero-fill a page fault (or an
            # fallocate then a fault) costs: a third of a fresh slot's cost at 1 GiB.
            os.posix_fallocate(self.fd, 0, self.data_off)
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(self.fd)
            os.unlink(path)
            raise _no_room(path, self.size, exc) from None
        except BaseException:
            os.close(self.fd)
            os.unlink(path)
            raise
        self.fresh = True
        """No version was written yet: the first goes through :meth:`write_fresh`, not the mapping,
        except for the first :attr:`populated` bytes."""
        self.populated = 0
        """Bytes at the start of the data region whose pages :meth:`populate` allocated and mapped."""
        self.state, self.version, self.gen = EMPTY, -1, 0
        self.manifest = b""  # JSON manifest of the version it holds (set when READY)
        self.leases: dict[int, float] = {}  # lease id -> expiry (TCP/RDMA/CUDA readers, in this process)
        self.extra: dict[str, Any] = {}  # per-transport handles (RDMA MR, ...)
        self.write_header()

    @property
    def manifest_cap(self) -> int:
        return self.data_off - self.manifest_off

    def write_fresh(self, offset: int, data: Any) -> None:
        """Write ``data`` (a contiguous buffer) at ``offset`` of the data region of a fresh slot with
        ``pwrite``: the kernel allocates each page as it fills it, with no zero-fill and no page
        fault, and a full /dev/shm is an ``OSError`` naming the fix, never a SIGBUS. Thread-safe."""
        view = memoryview(data).cast("B")
        pos = self.data_off + offset
        try:
            while view:
                n = os.pwrite(self.fd, view, pos)
                view, pos = view[n:], pos + n
        except OSError as exc:
            raise _no_room(self.path, self.size, exc) from None

    def populate(self, stop: threading.Event, chunk: int = POPULATE_CHUNK) -> bool:
        """Allocate and map this fresh slot's data pages, ``chunk`` bytes a step, until done or ``stop``
        is set; returns True when every page is in. Why: a fresh page costs its allocation when first
        written (0.5 s per GiB by ``pwrite`` on a 2-core VM, where a later version's copy takes
        0.15 s); done on a thread between :meth:`Publisher.reserve` and the first publish (the
        trainer's first step), that cost leaves the first version. Contents are never changed
        (``MADV_POPULATE_WRITE``); where the kernel lacks it, one byte a page is rewritten in place,
        so nothing may write the slot meanwhile: the publisher stops and joins the populator first.
        A full ``/dev/shm`` raises ``OSError`` naming the fix (a fault there would be a SIGBUS)."""
        if not self.fresh:
            return True
        import numpy as np  # deferred: readers of this module (shm subscribers) need no numpy at import

        holder = ctypes.c_char.from_buffer(self.mm)  # keeps the mapping (and so the address) alive
        try:
            base = ctypes.addressof(holder) + self.data_off
            free = _free_bytes(self.fd)
            todo = _page_up(self.data_cap) - self.populated
            if free is not None and free < todo:
                raise _no_room(self.path, self.size, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
            for off, n in chunk_ranges(self.populated, _page_up(self.data_cap), chunk):
                if stop.is_set():
                    return False
                try:
                    if not _madvise.populate(base + off, n):
                        pages = np.frombuffer(self.mm, np.uint8, n, self.data_off + off)[::PAGE]
                        np.add(pages, 0, out=pages)  # a write fault per page, same byte back
                        del pages
                except OSError as exc:
                    raise _no_room(self.path, self.size, exc) from None
                self.populated = off + n
        finally:
            del holder
        return True

    def written(self) -> None:
        """The first version is in: map the slot again with its pages populated, so that later
        versions copy through the mapping without a page fault each (~0.06 s per GiB, once)."""
        if not self.fresh:
            return
        self.fresh = False
        if self.populated >= self.data_cap:
            return  # populated ahead through this very mapping: nothing left to fault in
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        old, self.mm = self.mm, mmap.mmap(self.fd, self.size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            old.close()
        except BufferError:
            pass  # a view of the old mapping is still alive: it goes with it

    def data_view(self) -> Any:
        """The data region as a writable torch uint8 tensor (no copy)."""
        import torch  # deferred: torch is heavy; weights of numpy arrays never load it

        return torch.frombuffer(self.mm, dtype=torch.uint8, count=self.data_cap, offset=self.data_off)

    def try_lock(self) -> bool:
        """Exclusive lock without waiting: fails while any shm reader copies out of this slot."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def write_header(self, manifest: bytes = b"") -> None:
        if len(manifest) > self.manifest_cap:
            raise ValueError("manifest does not fit its slot")
        self.mm[self.manifest_off : self.manifest_off + len(manifest)] = manifest
        HEADER.pack_into(self.mm, 0, MAGIC, self.state, max(self.version, 0), self.gen,
                         self.manifest_off, len(manifest), self.data_off, self.data_cap)

    def close(self, unlink: bool = True) -> None:
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        try:
            self.mm.close()
        except BufferError:
            pass  # views still exported (zmq frames in flight); the mapping goes when they do
        try:
            os.close(self.fd)
        except OSError:
            pass


def _free_bytes(fd: int) -> int | None:
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _no_room(path: str, size: int, exc: OSError) -> OSError:
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM):
        return exc
    return OSError(exc.errno, f"cannot reserve {size} bytes in {os.path.dirname(path)} for weight slot "
                   f"{os.path.basename(path)}: {exc.strerror}; enlarge it (e.g. docker --shm-size, or a bigger "
                   f"emptyDir medium: Memory in Kubernetes)")


def write_ctl(path: str, doc: dict[str, Any]) -> None:
    """Replace the index atomically, so a reader sees the old or the new list, never half of one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # owner only, like the slots
        json.dump(doc, f)
    os.replace(tmp, path)


def read_ctl(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class MappedSlot:
    """Reader side of one slot: mapped read-only once (pages populated up front, once a version was
    written: populating a fresh slot's unwritten pages would allocate and zero them here) and
    reused across pulls."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(self.fd).st_size
            try:
                fresh = SlotHeader.read(os.pread(self.fd, HEADER.size, 0)).gen == 0
            except (ValueError, struct.error):
                fresh = False
            flags = mmap.MAP_SHARED | (0 if fresh else getattr(mmap, "MAP_POPULATE", 0))
            self.mm = mmap.mmap(self.fd, size, flags, mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self.ino = os.fstat(self.fd).st_ino

    def lock_shared(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def header(self) -> SlotHeader:
        return SlotHeader.read(self.mm)

    def manifest_bytes(self, h: SlotHeader) -> bytes:
        return self.mm[h.manifest_off : h.manifest_off + h.manifest_len]

    def data_view(self, h: SlotHeader) -> Any:
        import torch  # deferred: torch is heavy; weights of numpy arrays never load it

        with quiet_readonly():
            return torch.frombuffer(self.mm, dtype=torch.uint8, count=h.data_len, offset=h.data_off)

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass
        os.close(self.fd)


def cleanup_segments(job: str, proc: str | None = None, pid: int | None = None, shm_dir: str | None = None) -> list[str]:
    """Unlink the segments of one proc (``pid=None``: every pid of it that is no longer alive), or of a whole job.

    A whole-job sweep (a controller's exit) spares segments whose owner is another live process:
    a second controller can carry the same job id (a child ``rlmesh run`` inherits
    ``RLMESH_JOB_ID``), and its exit must not unlink the first one's live weight slots and
    heartbeat board. This process's own segments, and dead owners', go.
    """
    shm_dir = shm_dir or default_shm_dir()
    pat = f"{PREFIX}{safe(job)}-"
    if proc is not None:
        pat += f"{safe(proc)}-{pid if pid is not None else '*'}-"
    removed = []
    for path in glob.glob(os.path.join(shm_dir, glob.escape(pat).replace(r"[*]", "*") + "*")):
        if proc is None:
            owner = owner_pid(os.path.basename(path))
            if owner not in (None, os.getpid()) and owner > 0 and pid_running(owner) and not _pid_reused_since(owner, path):
                continue
        if proc is not None and pid is None:
            try:
                owner = int(os.path.basename(path)[len(PREFIX):].split("-")[2])
                os.kill(owner, 0)
                continue  # still alive (a restarted incarnation): not ours to remove
            except (ValueError, IndexError, ProcessLookupError):
                pass
            except PermissionError:
                continue
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    if removed:
        logger.info("removed %d weight segment(s) of job %s%s", len(removed), job, f" proc {proc}" if proc else "")
    return removed


def owner_pid(segment: str) -> int | None:
    """The pid of the process that created ``segment`` (a file name under the shm dir), from its
    name (``rlmesh-w-<job>-<proc>-<pid>-...``); ``None`` if it is not an rlmesh segment."""
    if not segment.startswith(PREFIX):
        return None
    try:
        return int(segment[len(PREFIX):].split("-")[2])
    except (ValueError, IndexError):
        return None


def _pid_reused_since(pid: int, path: str) -> bool:
    """True when process ``pid`` started after ``path`` was last written (with 2 s of slack for
    the clock's granularity): it cannot be the creator, whose pid was since reused. A live
    creator's files are always newer than its start; a dead one's are never written again."""
    try:
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        with open(f"/proc/{pid}/stat", "rb") as f:
            start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        started = btime + start_ticks / os.sysconf("SC_CLK_TCK")
        return started > os.stat(path).st_mtime + 2.0
    except (OSError, ValueError, IndexError, StopIteration):
        return False  # cannot tell: keep it


def reclaim_dead_segments(shm_dir: str | None = None) -> list[str]:
    """Unlink every rlmesh segment (slots, ``.ctl``, leftover ``.tmp``) whose creating process is
    gone (or whose pid now belongs to a process started after the file was last written),
    whatever job it belonged to: what a run killed outright (every proc SIGKILLed, the
    controller too) leaves behind, since nobody was left to clean up. A live owner's segments,
    and those of a pid this user may not signal, are kept. Run at each controller start
    (``rlmesh run``/``resume``) and by ``rlmesh clean``.

    Limit: the owner is judged by pid on this host's pid namespace; a container sharing this
    ``/dev/shm`` from another pid namespace must not run it.
    """
    shm_dir = shm_dir or default_shm_dir()
    removed = []
    for path in glob.glob(os.path.join(glob.escape(shm_dir), PREFIX + "*")):
        pid = owner_pid(os.path.basename(path))
        if pid is None or pid <= 0:
            continue
        if pid_running(pid) and not _pid_reused_since(pid, path):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except (FileNotFoundError, PermissionError):
            pass
    if removed:
        logger.warning("reclaimed %d shared-memory segment(s) left by dead processes in %s", len(removed), shm_dir)
    return removed
