"""What the supervisor does when a proc dies, and how it decides that one has.

Two policies, both per proc mesh (``spawn_procs(restart=...)``):

- :class:`Restart` is the restart budget as an *intensity*, the way OTP supervisors define it:
  at most ``max_restarts`` restarts of a proc within any ``within_s`` seconds. A steady trickle
  of faults (a flaky node, an operator's kill every few seconds) is survived for as long as the
  run lasts, while a crash loop (a proc that dies as fast as it is restarted) still exhausts the
  budget within seconds and stops the run. ``within_s=None`` keeps the old lifetime count.
- :class:`FailureDetection` holds every timeout the supervisor applies, each named by the key
  that sets it (``run.*`` in a recipe), so an error can say which knob to turn.

How a death is decided (:class:`HeartbeatMonitor`, :func:`os_state`): where the OS can say, it
decides with certainty: a local proc's exit is seen by ``waitpid`` (the launcher's ``poll``), and
a stopped one (SIGSTOP, state ``T`` in ``/proc/<pid>/stat``) is a hang once its heartbeat has been
silent for ``heartbeat_timeout_s``. Where it cannot (a running proc whose heartbeats stop: stuck
in a C call holding the GIL, or just starved of CPU on a busy host), the allowed silence is learned
from the heartbeat gaps actually observed (phi-accrual with a floor): the largest of the floor
``heartbeat_timeout_s``, the phi threshold's quantile of a normal fit to the proc's recent
inter-arrival times, and :data:`GAP_MARGIN` times the longest gap seen in the last
:data:`GAP_WINDOW_S` seconds on the proc's host (:class:`HostGaps`, every proc there pooled) or in
the proc's own history. Why gaps and not the load average: a busy host delays every proc's beats
alike, so the gaps show within a second what a live proc there needs, while the load average is a
1-minute mean of runnable tasks (each death's burst of woken procs included) that says little about
any one proc's delay. At load 8 on 2 cores live procs' beats lagged at most 0.7-1.5 s, while the old
rule (the floor times the load per CPU) waited 6 s for a hang. On a quiet host the allowance is the
floor (1.5 s). Several procs falling silent together point at a common cause (the controller's own
process starved): the supervisor then waits twice as long.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from rlmesh import settings

HB_TIMEOUT_ENV = settings.HEARTBEAT_TIMEOUT_S.name
INIT_HB_TIMEOUT_ENV = settings.INIT_HEARTBEAT_TIMEOUT_S.name
START_TIMEOUT_ENV = settings.START_TIMEOUT_S.name
SPAWN_TIMEOUT_ENV = settings.SPAWN_TIMEOUT_S.name

TICK_S = 0.05
"""How often the supervisor scans its procs (exits, timeouts, heartbeat silence)."""
HB_ACK_EVERY_S = 2.0
"""A worker's heartbeats are acknowledged at most this often (its controller-silence limit is 10 s)."""
HB_BASE_S = 0.2
"""The heartbeat interval while the controller supervises few procs."""
HB_BUDGET_PER_S = 1000.0
"""Heartbeats per second the controller is willing to read; past it, each worker beats less often..."""
HB_MAX_S = 1.0
"""...but at least once a second (past 1,000 procs on one controller, per-host agents are the way on)."""


def heartbeat_interval(n_procs: int) -> float:
    """The heartbeat interval the supervisor asks of each of ``n_procs`` workers: 0.2 s up to 200 procs,
    then ``n / 1000`` s (the controller reads about 1,000 beats a second), at most 1 s (1,000 procs).
    A hang is then judged against twice the longest recent gap (2 s at 1,000 procs, the 1.5 s floor below
    about 750); an exit is seen at once whatever N."""
    return min(HB_MAX_S, max(HB_BASE_S, n_procs / HB_BUDGET_PER_S))


_SETTINGS: dict[str, settings.Setting[Any]] = {
    "heartbeat_timeout_s": settings.HEARTBEAT_TIMEOUT_S, "init_heartbeat_timeout_s": settings.INIT_HEARTBEAT_TIMEOUT_S,
    "start_timeout_s": settings.START_TIMEOUT_S, "spawn_timeout_s": settings.SPAWN_TIMEOUT_S,
    "heartbeat_phi": settings.HEARTBEAT_PHI}
_ENV_KEYS = {f: s.name for f, s in _SETTINGS.items()}


@dataclass(frozen=True)
class FailureDetection:
    """The supervisor's timeouts for one proc mesh. ``key_prefix``: how errors name a field
    (``"run."`` gives ``run.start_timeout_s``; empty: the environment variable that sets it)."""

    start_timeout_s: float = settings.START_TIMEOUT_S.default
    """A proc must join (interpreter up, imports done, connected) within this (120 s, as a recipe's
    ``run.start_timeout_s``: a busy host or a cold image needs that long, and only a start that hangs
    waits it out; a proc that exits is seen at once)."""
    heartbeat_timeout_s: float = settings.HEARTBEAT_TIMEOUT_S.default
    """The least heartbeat silence that makes a proc dead (a quiet host's detection time for a hang)."""
    init_heartbeat_timeout_s: float = settings.INIT_HEARTBEAT_TIMEOUT_S.default
    """The same floor while an actor's ``__init__`` runs (first imports hold the GIL for seconds)."""
    spawn_timeout_s: float | None = settings.SPAWN_TIMEOUT_S.default
    """How long one actor's ``__init__`` may take while its proc lives (None: no limit; a long
    construction is not a hang, a dead or silent proc is caught by the rules above)."""
    heartbeat_phi: float = settings.HEARTBEAT_PHI.default
    """Suspicion threshold: a silence as unlikely as 10**-phi under the observed heartbeat delays."""
    key_prefix: str = ""

    def __post_init__(self) -> None:
        for f in ("start_timeout_s", "heartbeat_timeout_s", "init_heartbeat_timeout_s", "heartbeat_phi"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{self.key(f)}={getattr(self, f)!r}: use a positive number")
        if self.spawn_timeout_s is not None and not self.spawn_timeout_s > 0:
            raise ValueError(f"{self.key('spawn_timeout_s')}={self.spawn_timeout_s!r}: use a positive number or None")

    def key(self, field: str) -> str:
        """The name a user sets ``field`` by, for error messages."""
        return f"{self.key_prefix}{field}" if self.key_prefix else _ENV_KEYS[field]

    @classmethod
    def from_env(cls) -> "FailureDetection":
        """Defaults, overridden by the ``RLMESH_*`` variables (the library's knobs outside a recipe)."""
        kw: dict[str, Any] = {}
        for f in fields(cls):
            s = _SETTINGS.get(f.name)
            if s is not None and s.is_set():
                kw[f.name] = s.get()
        init = kw.get("init_heartbeat_timeout_s")
        if init is not None and kw.get("heartbeat_timeout_s") and init < kw["heartbeat_timeout_s"]:
            kw["init_heartbeat_timeout_s"] = kw["heartbeat_timeout_s"]
        return cls(**kw)


@dataclass(frozen=True)
class Restart:
    """What to do when a proc dies: restart it, at most ``max_restarts`` times within any ``within_s``
    seconds (0: never, the default; -1: forever; ``within_s=None``: ``max_restarts`` in the proc's
    lifetime, the old meaning). ``backoff_s``: wait this long before each replacement is launched.
    ``detection``: the mesh's timeouts (None: :meth:`FailureDetection.from_env`).
    """

    max_restarts: int = 0
    backoff_s: float = 0.0
    within_s: float | None = None
    detection: FailureDetection | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < -1:
            raise ValueError(f"Restart(max_restarts={self.max_restarts!r}): use 0 (never), N > 0, or -1 (forever)")
        if self.backoff_s < 0:
            raise ValueError(f"Restart(backoff_s={self.backoff_s!r}) must be >= 0 seconds")
        if self.within_s is not None and not self.within_s > 0:
            raise ValueError(f"Restart(within_s={self.within_s!r}): use a positive number of seconds, or None "
                             f"for a lifetime budget")

    @property
    def restartable(self) -> bool:
        return self.max_restarts != 0

    def allows(self, past: "deque[float] | list[float] | int", now: float = 0.0) -> bool:
        """May a proc whose restarts happened at monotonic times ``past`` be restarted at ``now``?
        (An int is a plain count, for a lifetime budget.)"""
        if self.max_restarts == -1:
            return True
        if isinstance(past, int):
            return past < self.max_restarts
        recent = len(past) if self.within_s is None else sum(1 for t in past if now - t < self.within_s)
        return recent < self.max_restarts

    def describe(self) -> str:
        if self.max_restarts == -1:
            return "restarts without limit"
        span = "in its lifetime" if self.within_s is None else f"within {self.within_s:g} s"
        return f"at most {self.max_restarts} restarts {span}"


# ---------------------------------------------------------------------------------------- detection
class OsState(StrEnum):
    """What the kernel says about a local pid."""

    RUNNING = "running"  # running, runnable, sleeping or in disk wait: it may just be slow
    STOPPED = "stopped"  # SIGSTOP / job control / ptrace stop: frozen, it will not heartbeat
    GONE = "gone"  # exited (a zombie or no such pid)
    UNKNOWN = "unknown"  # not a Linux /proc, or unreadable


def os_state(pid: int | None) -> OsState:
    """The state of a local ``pid`` from ``/proc/<pid>/stat`` (field 3)."""
    if pid is None or not sys.platform.startswith("linux"):
        return OsState.UNKNOWN
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except FileNotFoundError:
        return OsState.GONE
    except (OSError, IndexError):
        return OsState.UNKNOWN
    if state in (b"T", b"t"):
        return OsState.STOPPED
    if state in (b"Z", b"X", b"x"):
        return OsState.GONE
    return OsState.RUNNING


GAP_MARGIN = 2.0
"""A running proc is suspected once its silence passes this many times the longest recent gap."""
GAP_WINDOW_S = 60.0
"""How far back the gaps of a host count (a busy spell a minute ago says little about now)."""


class HostGaps:
    """The longest heartbeat gap of any proc on one host, per second, over the last ``window_s``.

    Why per host: a slow host delays every proc's beats alike, so its hundreds of procs show within
    a second what a live proc there needs, where one proc's own history is thin (just restarted)
    or old. Kept as one maximum per second, so a beat costs a comparison and the longest recent gap
    is a scan of at most ``window_s`` numbers."""

    def __init__(self, window_s: float = GAP_WINDOW_S) -> None:
        self.window_s = window_s
        self._secs: deque[list[float]] = deque()  # [second, longest gap that ended in it], oldest first

    def add(self, t: float, gap: float) -> None:
        """A gap of ``gap`` s that ended at ``t`` (beats are read in slot order, not time order: a
        beat older than the newest second counts in that second)."""
        sec = float(int(t))
        last = self._secs[-1] if self._secs else None
        if last is not None and sec <= last[0]:
            if gap > last[1]:
                last[1] = gap
            return
        self._secs.append([sec, gap])
        self._trim(sec)

    def longest(self, now: float) -> float:
        """The longest gap that ended within the last ``window_s`` before ``now`` (0: none)."""
        self._trim(now)
        return max((g for _, g in self._secs), default=0.0)

    def _trim(self, now: float) -> None:
        while self._secs and self._secs[0][0] < now - self.window_s:
            self._secs.popleft()


def _normal_quantile_tail(phi: float) -> float:
    """z with P(N(0,1) > z) = 10**-phi (bisection on erfc; no scipy needed for one number)."""
    target = 10.0 ** -phi
    lo, hi = 0.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2)) > target:
            lo = mid
        else:
            hi = mid
    return hi


class HeartbeatMonitor:
    """Heartbeat arrivals of one proc (kept across its incarnations: the host's delays are what it
    measures) and the silence they make suspicious (phi-accrual with a floor and a gap rule).
    ``host``: the gaps of every proc on its host, which its own gaps join (set once it said where
    it runs)."""

    MIN_STD_S = 0.05
    MIN_SAMPLES = 5

    def __init__(self, window: int = 300) -> None:
        self.intervals: deque[float] = deque(maxlen=window)  # ~1 min of 0.2 s heartbeats
        self.last: float | None = None
        self.host: HostGaps | None = None
        self._z: dict[float, float] = {}

    def beat(self, now: float) -> None:
        if self.last is not None and now > self.last:
            gap = now - self.last
            self.intervals.append(gap)
            if self.host is not None:
                self.host.add(now, gap)
        self.last = now

    def restart(self, now: float) -> None:
        """A new incarnation joined: its silence counts from now; the delay history stays."""
        self.last = now

    def silence(self, now: float) -> float:
        return 0.0 if self.last is None else now - self.last

    def allowance(self, floor: float, phi: float, now: float | None = None) -> float:
        """Seconds of silence before the proc is suspected: never below ``floor``; at least
        :data:`GAP_MARGIN` times the longest gap of its own recent beats and of its host's in the
        last :data:`GAP_WINDOW_S` before ``now`` (default: its last beat)."""
        at = now if now is not None else self.last or 0.0
        longest = self.host.longest(at) if self.host is not None else 0.0
        n = len(self.intervals)
        if n:
            longest = max(longest, max(self.intervals))
        fit = 0.0
        if n >= self.MIN_SAMPLES:
            mean = sum(self.intervals) / n
            std = max(self.MIN_STD_S, math.sqrt(sum((x - mean) ** 2 for x in self.intervals) / n))
            z = self._z.get(phi)
            if z is None:
                z = self._z[phi] = _normal_quantile_tail(phi)
            fit = mean + z * std
        return max(floor, fit, GAP_MARGIN * longest)


def silent_death(rec: Any, now: float, together: int = 1) -> str | None:
    """Why a proc that has not exited counts as dead, or None while it may just be slow.

    ``rec`` is the controller's record of it (``last_hb``, ``hb``, ``detect``, ``handle``,
    ``spawns_pending``). The OS decides where it can: a stopped local proc is frozen, a hang.
    Otherwise the silence must exceed what the heartbeat gaps observed on its host and its own
    make plausible, twice that when ``together`` procs fell silent at once (a common cause: the
    controller's own process starved)."""
    d: FailureDetection = rec.detect
    silence = now - rec.last_hb
    if silence <= d.heartbeat_timeout_s:
        return None
    pid = getattr(rec.handle, "local_pid", None)
    state = os_state(pid) if pid is not None else OsState.UNKNOWN
    if state is OsState.GONE:
        return None  # its exit is collected by the launcher's poll() on the next tick
    if state is OsState.STOPPED:
        return f"heartbeat silent for {silence:.1f}s and the proc is stopped (SIGSTOP or a debugger): a hang"
    floor = d.init_heartbeat_timeout_s if rec.spawns_pending else d.heartbeat_timeout_s
    allowed = rec.hb.allowance(floor, d.heartbeat_phi, now) * (2.0 if together > 1 else 1.0)
    if silence <= allowed:
        return None
    key = d.key("init_heartbeat_timeout_s" if rec.spawns_pending else "heartbeat_timeout_s")
    return (f"heartbeat timeout: silent for {silence:.1f}s, beyond the {allowed:.1f}s the heartbeat gaps seen "
            f"on its host allow ({key}={floor:g} is the floor)")
