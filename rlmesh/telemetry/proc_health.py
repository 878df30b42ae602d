"""Each proc's own memory, CPU, threads and open files (``proc_health``), and the RSS growth warning.

Every proc of a run (the controller and each worker) samples *itself*, on the health thread it
already runs (:class:`rlmesh.telemetry.health.HealthSampler`), every
``RLMESH_PROC_HEALTH_INTERVAL`` seconds (default 5; ``0``, or ``RLMESH_HEALTH_INTERVAL=0``,
turns it off). The row is recorded outside any actor, so its ``mesh``/``rank``/``proc``/``host``
columns name the proc itself (``controller`` in the controller).

Growth without bound: :class:`RssGrowthWatch` keeps the samples of the last ``window_s`` and warns
(a ``warning`` on that row, and one log line) only when all of these hold, so a slow or busy
machine (late samples, a proc that loads a model once, a buffer filling up) does not set it off:

- the samples span the whole window (default 300 s) and there are at least 8 of them;
- the least-squares slope of RSS over time is positive;
- RSS rose in *every* quarter of the window, each quarter's median above the one before by at
  least a quarter of an even share of the total rise (a one-off step, like a model load, rises in
  one quarter only);
- the rise from the first quarter's median to the last's is at least ``min_growth_bytes``
  (default 512 MiB) and at least ``min_ratio`` (default 0.5) of the first quarter's median.

After a warning the watch stays quiet until the last quarter's median doubles from the one it
warned at, so a real leak logs a handful of lines over a run, not one per sample.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections import deque
from dataclasses import dataclass

import psutil

from rlmesh import settings
from rlmesh.actor.context import current_proc

logger = logging.getLogger(__name__)

PROC_INTERVAL_ENV = settings.PROC_HEALTH_INTERVAL.name
GROWTH_WINDOW_ENV = settings.RSS_GROWTH_WINDOW_S.name
GROWTH_MIN_MB_ENV = settings.RSS_GROWTH_MIN_MB.name
GROWTH_RATIO_ENV = settings.RSS_GROWTH_RATIO.name
MB = 1 << 20


def proc_interval_from_env() -> float:
    """Seconds between ``proc_health`` samples (``RLMESH_PROC_HEALTH_INTERVAL``); 0 = off."""
    return settings.PROC_HEALTH_INTERVAL.get()


@dataclass(frozen=True)
class GrowthPolicy:
    """When :class:`RssGrowthWatch` calls a proc's RSS growth unbounded (see the module docstring)."""

    window_s: float = settings.RSS_GROWTH_WINDOW_S.default
    """How much history a verdict needs and looks at, seconds (``RLMESH_RSS_GROWTH_WINDOW_S``)."""
    min_growth_bytes: int = int(settings.RSS_GROWTH_MIN_MB.default * MB)
    """The rise over the window must be at least this (``RLMESH_RSS_GROWTH_MIN_MB``, in MiB)."""
    min_ratio: float = settings.RSS_GROWTH_RATIO.default
    """... and at least this fraction of RSS at the window's start (``RLMESH_RSS_GROWTH_RATIO``)."""
    segments: int = 4
    """The window is cut into this many parts; RSS must rise in every one."""
    min_samples: int = 8
    """Fewer samples than this in the window (a starved sampler): no verdict."""

    @classmethod
    def from_env(cls) -> "GrowthPolicy":
        return cls(window_s=settings.RSS_GROWTH_WINDOW_S.get(),
                   min_growth_bytes=int(settings.RSS_GROWTH_MIN_MB.get() * MB),
                   min_ratio=settings.RSS_GROWTH_RATIO.get())


@dataclass(frozen=True)
class Growth:
    """A verdict of unbounded growth over one window."""

    start_rss: int
    """Median RSS of the window's first part, bytes."""
    end_rss: int
    """Median RSS of its last part, bytes."""
    window_s: float
    """Seconds the samples span."""
    slope_bytes_per_s: float
    """Least-squares slope of RSS over the window."""

    def describe(self) -> str:
        return (f"RSS grows without bound: {self.start_rss / MB:.0f} -> {self.end_rss / MB:.0f} MB over the last "
                f"{self.window_s / 60:.1f} min ({self.slope_bytes_per_s * 60 / MB:+.1f} MB/min, rising all along)")


def slope(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``ts`` (0 when the times do not vary)."""
    n = len(ts)
    if n < 2:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var <= 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var


class RssGrowthWatch:
    """Pure logic: feed ``(t, rss)`` samples (monotonic seconds, bytes); :meth:`add` returns a
    :class:`Growth` the first time the policy's conditions hold, then again only once RSS has
    doubled from the level it last warned at."""

    def __init__(self, policy: GrowthPolicy | None = None):
        self.policy = policy or GrowthPolicy()
        self._samples: deque[tuple[float, int]] = deque()
        self._rearm_at = 0  # RSS a new warning needs (0: none given yet)

    def add(self, t: float, rss: int) -> Growth | None:
        p, s = self.policy, self._samples
        s.append((t, rss))
        while len(s) > 1 and s[1][0] <= t - p.window_s:  # keep one sample at or before the window's start
            s.popleft()
        if rss < self._rearm_at:  # (a cheap test first: the last part's median is near the newest sample)
            return None
        g = self.verdict()
        if g is None or g.end_rss < self._rearm_at:
            return None
        self._rearm_at = 2 * g.end_rss
        return g

    def verdict(self) -> Growth | None:
        """The current window's verdict, without side effects."""
        p, s = self.policy, self._samples
        if len(s) < max(p.min_samples, 2 * p.segments):
            return None
        t0, t1 = s[0][0], s[-1][0]
        span = t1 - t0
        if span < p.window_s:
            return None
        parts: list[list[int]] = [[] for _ in range(p.segments)]
        for t, r in s:
            parts[min(int((t - t0) / span * p.segments), p.segments - 1)].append(r)
        if any(not part for part in parts):  # a gap longer than a part: too little to judge
            return None
        medians = [statistics.median(part) for part in parts]
        rise = medians[-1] - medians[0]
        if rise < p.min_growth_bytes or rise < p.min_ratio * medians[0]:
            return None
        step_floor = rise / (p.segments - 1) / 4
        if any(b - a < step_floor for a, b in zip(medians, medians[1:])):
            return None
        k = slope([t for t, _ in s], [float(r) for _, r in s])
        if k <= 0:
            return None
        return Growth(int(medians[0]), int(medians[-1]), span, k)


@dataclass(frozen=True)
class ProcSample:
    """One ``proc_health`` row (its columns are these fields)."""

    pid: int
    rss: int
    """Resident memory, bytes."""
    vms: int
    """Virtual memory, bytes."""
    cpu_pct: float
    """CPU used since the previous sample, percent of one core (may exceed 100 with threads)."""
    threads: int
    fds: int | None
    """Open file descriptors (None where the OS does not say)."""
    warning: str | None = None
    """Set on the sample where unbounded RSS growth was detected."""

    def row(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class ProcSampler:
    """Samples one process (this one by default) and watches its RSS for unbounded growth."""

    def __init__(self, process: psutil.Process | None = None, policy: GrowthPolicy | None = None):
        self.process = process or psutil.Process()
        self.watch = RssGrowthWatch(policy or GrowthPolicy.from_env())
        self.process.cpu_percent(interval=None)  # prime: the first reading is meaningless

    def sample(self, now: float) -> ProcSample:
        """Read the process now (``now``: monotonic seconds, for the growth watch)."""
        p = self.process
        with p.oneshot():
            mem = p.memory_info()
            cpu = float(p.cpu_percent(interval=None))
            threads = p.num_threads()
            try:
                fds: int | None = p.num_fds()
            except (AttributeError, psutil.Error):  # not on Windows
                fds = None
        growth = self.watch.add(now, int(mem.rss))
        warning = growth.describe() if growth else None
        if warning:
            me = current_proc()
            logger.warning("%s (pid %d): %s", me.proc_id if me else "controller", p.pid, warning)
        return ProcSample(p.pid, int(mem.rss), int(mem.vms), cpu, int(threads), fds, warning)
