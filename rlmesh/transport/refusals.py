"""Counting and reporting refused messages: every refusal counted, warnings rate-limited per peer.

Why rate-limited: a peer that floods a port with garbage (or replays a capture in a
loop) must not flood the log too. Each channel says one line per peer per
:data:`INTERVAL_S`, carrying how many messages that peer had refused since the last line.
The counts are kept per channel and per process (:func:`refusal_stats`); each warning
line also goes to the refusal sink (:func:`set_refusal_sink`), which telemetry turns
into a row of the ``refusals`` table, so the count is in the run's database too.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger("rlmesh.transport")

INTERVAL_S = 10.0
_MAX_PEERS = 1024  # remembered peers per channel for rate limiting (oldest forgotten first)


@dataclass
class RefusalCounts:
    """Messages a channel dropped: ``rejected`` failed the MAC (forged, cut, wrong key), ``replayed`` were stale."""

    rejected: int = 0
    replayed: int = 0

    @property
    def total(self) -> int:
        return self.rejected + self.replayed


@dataclass(frozen=True)
class RefusalReport:
    """One rate-limited report: ``count`` messages from ``peer`` refused on ``channel`` since the last one."""

    channel: str
    peer: str
    reason: str
    count: int
    rejected_total: int  # on this channel, since it was bound
    replayed_total: int


_logs: "weakref.WeakSet[RefusalLog]" = weakref.WeakSet()  # a closed channel's counts go with it
_registry_lock = threading.Lock()
_sink: Callable[[RefusalReport], None] | None = None


def set_refusal_sink(fn: Callable[[RefusalReport], None] | None) -> None:
    """Install ``fn`` to receive every rate-limited refusal report of this process (telemetry does)."""
    global _sink
    _sink = fn


def refusal_stats() -> dict[str, RefusalCounts]:
    """This process's refusal counts by channel name, over its open channels (a snapshot)."""
    out: dict[str, RefusalCounts] = {}
    with _registry_lock:
        logs = list(_logs)
    for log in logs:
        c = out.setdefault(log.channel, RefusalCounts())
        c.rejected += log.counts.rejected
        c.replayed += log.counts.replayed
    return out


class RefusalLog:
    """One channel's refusal counter and rate-limited warning."""

    def __init__(self, channel: str, interval_s: float = INTERVAL_S):
        self.channel = channel
        self.interval_s = interval_s
        self.counts = RefusalCounts()
        with _registry_lock:
            _logs.add(self)
        self._peers: dict[str, tuple[float, int]] = {}  # peer -> (last line at, refused since)

    def refused(self, peer: str, reason: str) -> None:
        self.counts.rejected += 1
        self._note(peer, reason)

    def replayed(self, peer: str, reason: str = "replayed or reordered (stale counter)") -> None:
        self.counts.replayed += 1
        self._note(peer, reason)

    def _note(self, peer: str, reason: str) -> None:
        now = time.monotonic()
        last, since = self._peers.pop(peer, (-1e18, 0))
        since += 1
        if now - last >= self.interval_s:
            logger.warning("%s: refused %d message(s) from %s in the last %.0fs (%s); %d refused on this "
                           "channel so far", self.channel, since, peer, min(now - last, self.interval_s), reason,
                           self.counts.total)
            sink = _sink
            if sink is not None:
                try:
                    sink(RefusalReport(self.channel, peer, reason, since, self.counts.rejected, self.counts.replayed))
                except Exception:
                    logger.debug("refusal sink failed", exc_info=True)
            last, since = now, 0
        self._peers[peer] = (last, since)
        if len(self._peers) > _MAX_PEERS:
            self._peers.pop(next(iter(self._peers)))
