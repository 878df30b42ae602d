"""Host and GPU health, sampled once per host (not once per proc), 1 Hz by default; and each proc's own.

Every proc of a run starts a :class:`HealthSampler`, but only the one holding the
host's lock file (``$TMPDIR/rlmesh-health-<run>-<host>.lock``, ``flock``) samples the host.
The controller takes it first on its own host; on other hosts the first worker does.
When the holder dies the kernel frees the lock and another proc on that host takes
over within a few seconds, so a host never goes silent because one proc crashed.

The same thread, in every proc, samples the proc itself into ``proc_health`` every
``RLMESH_PROC_HEALTH_INTERVAL`` seconds (:mod:`rlmesh.telemetry.proc_health`).

``RLMESH_HEALTH_INTERVAL`` sets the period in seconds (``0`` turns all health sampling off).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from rlmesh import settings
from rlmesh.telemetry.gpu import GpuSampler
from rlmesh.telemetry.proc_health import ProcSampler, proc_interval_from_env

logger = logging.getLogger(__name__)

INTERVAL_ENV = settings.HEALTH_INTERVAL.name
RETRY_LOCK_S = 3.0


def interval_from_env() -> float:
    """Seconds between host samples (``RLMESH_HEALTH_INTERVAL``); 0 = off."""
    return settings.HEALTH_INTERVAL.get()


TREE_REFRESH_S = 5.0


class ProcessTree:
    """The sampling process and its descendants, whose memory is the ``rss`` column.

    Why the list is kept and only re-read every ``refresh_s``: psutil finds descendants by reading every
    process's ``/proc/<pid>/stat`` on the host, 1.1 ms a sample with 76 processes and about 15 ms with
    1,000; that was most of a sample's cost, every second, in every run's controller. Reading the
    memory of the processes already known is one small read each. A proc started since the last
    listing counts from the next one (at most ``refresh_s`` later); one that ended drops out at once.
    """

    def __init__(self, root: psutil.Process, refresh_s: float = TREE_REFRESH_S):
        self.root = root
        self.refresh_s = refresh_s
        self._procs: list[psutil.Process] = [root]
        self._listed_at = float("-inf")

    @property
    def pids(self) -> list[int]:
        """The processes the last :meth:`rss` counted."""
        return [p.pid for p in self._procs]

    def rss(self) -> int:
        now = time.monotonic()
        if now - self._listed_at >= self.refresh_s:
            try:
                self._procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                self._procs = [self.root]
            self._listed_at = now
        total, alive = 0, []
        for p in self._procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue  # exited since it was listed
            alive.append(p)
        self._procs = alive
        return total


def host_sample(tree: ProcessTree) -> dict[str, Any]:
    """One ``host_health`` row (cpu_pct is since the previous call, as psutil measures it); ``rss`` is
    that of ``tree``'s processes (the sampler keeps one tree, so its list is re-read only every refresh)."""
    vm = psutil.virtual_memory()
    rss = tree.rss()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return {
        "cpu_pct": float(psutil.cpu_percent(interval=None)),
        "mem_total": int(vm.total),
        "mem_available": int(vm.available),
        "mem_used_pct": float(vm.percent),
        "swap_used": int(psutil.swap_memory().used),
        "rss": rss,
        "load_1m": load[0], "load_5m": load[1], "load_15m": load[2],
    }


class HealthSampler:
    """Background thread; ``record(table, row)`` is the recorder's trusted-row entry point."""

    def __init__(self, record: Any, run_id: str, interval: float | None = None, gpus: bool = True,
                 proc_interval: float | None = None):
        self._record = record
        self.interval = interval_from_env() if interval is None else interval
        self.proc_interval = proc_interval_from_env() if proc_interval is None else proc_interval
        """Seconds between this proc's own ``proc_health`` samples; 0 (or ``interval`` 0) = off."""
        if self.interval <= 0:
            self.proc_interval = 0.0
        self.host = socket.gethostname()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{run_id}-{self.host}")
        self.lock_path = Path(tempfile.gettempdir()) / f"rlmesh-health-{safe}.lock"
        self._fd: int | None = None
        self._gpus_wanted = gpus
        self._gpu: GpuSampler | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlmesh-telemetry-health", daemon=True)
        self.samples = 0
        self.proc_samples = 0

    def start(self) -> "HealthSampler":
        if self.interval > 0:
            self._thread.start()
        return self

    @property
    def is_sampler(self) -> bool:
        """Whether this proc holds the host's lock (and so does the sampling)."""
        return self._fd is not None

    def _try_lock(self) -> bool:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        return True

    def _loop(self) -> None:
        me = ProcessTree(psutil.Process())
        own = ProcSampler() if self.proc_interval > 0 else None
        now = time.monotonic()
        next_host = now
        next_proc = now + self.proc_interval  # the first reading of cpu_pct needs an interval behind it
        while not self._stop.is_set():
            now = time.monotonic()
            if own is not None and now >= next_proc:
                self._sample_proc(own, now)
                next_proc = now + self.proc_interval
            if now >= next_host:
                next_host = now + self._sample_host(me)
            wake = min(next_host, next_proc) if own is not None else next_host
            self._stop.wait(max(0.0, wake - time.monotonic()))

    def _sample_proc(self, own: ProcSampler, now: float) -> None:
        try:
            self._record("proc_health", own.sample(now).row())
            self.proc_samples += 1
        except Exception:
            logger.exception("telemetry: proc health sample failed")

    def _sample_host(self, me: ProcessTree) -> float:
        """Sample the host if this proc holds its lock; returns the seconds until the next try."""
        if self._fd is None and not self._try_lock():
            return RETRY_LOCK_S
        if self._gpu is None and self._gpus_wanted:
            self._gpu = GpuSampler()
            if not self._gpu.available:
                logger.info("telemetry: %s on %s; gpu_health stays empty", self._gpu.why_unavailable, self.host)
            psutil.cpu_percent(interval=None)  # prime: the first reading is meaningless
            self._stop.wait(min(self.interval, 0.2))
        try:
            self._record("host_health", host_sample(me))
            for row in self._gpu.sample() if self._gpu else ():
                self._record("gpu_health", row)
            self.samples += 1
        except Exception:
            logger.exception("telemetry: health sample failed")
        return self.interval

    def stop(self, unlink: bool = False) -> None:
        """Stop sampling; ``unlink`` (the controller, at the end of the run) also removes the lock file."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=3)
        if self._gpu is not None:
            self._gpu.close()
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
        if unlink:  # only when the run is over: unlinking under live peers could elect two samplers
            self.lock_path.unlink(missing_ok=True)
