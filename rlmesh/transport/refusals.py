"""Counting and reporting refused messages: every refusal counted, warnings rate-limited per peer.

Why rate-limited: a peer that floods a port with garbage (or replays a capture in a
loop) must not flood the log too. Each channel says one line per peer per
:data:`INTERVAL_S`, carrying how many messages that peer had refused since the last line.
The counts are kept per channel and, summed, per process (:func:`refusal_stats`):
the worker ships them as rows of the ``refusals`` telemetry table when telemetry is on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

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


_registry: dict[str, RefusalCounts] = {}
_registry_lock = threading.Lock()


def refusal_stats() -> dict[str, RefusalCounts]:
    """This process's refusal counts by channel name (a snapshot)."""
    with _registry_lock:
        return {k: RefusalCounts(v.rejected, v.replayed) for k, v in _registry.items()}


class RefusalLog:
    """One channel's refusal counter and rate-limited warning."""

    def __init__(self, channel: str, interval_s: float = INTERVAL_S):
        self.channel = channel
        self.interval_s = interval_s
        self.counts = RefusalCounts()
        with _registry_lock:
            _registry[f"{channel}@{id(self):x}"] = self.counts
        self._peers: dict[str, tuple[float, int]] = {}  # peer -> (last line at, refused since)

    def refused(self, peer: str, reason: str) -> None:
        self.counts.rejected += 1
        self._note(peer, reason)

    def replayed(self, peer: str) -> None:
        self.counts.replayed += 1
        self._note(peer, "a replayed or reordered message (stale counter)")

    def _note(self, peer: str, reason: str) -> None:
        now = time.monotonic()
        last, since = self._peers.pop(peer, (-1e18, 0))
        since += 1
        if now - last >= self.interval_s:
            logger.warning("%s: refused %d message(s) from %s in the last %.0fs (%s); %d refused on this "
                           "channel so far", self.channel, since, peer, min(now - last, self.interval_s), reason,
                           self.counts.total)
            last, since = now, 0
        self._peers[peer] = (last, since)
        if len(self._peers) > _MAX_PEERS:
            self._peers.pop(next(iter(self._peers)))
