"""What each publish and pull cost, returned to the caller and recorded as ``weight_syncs`` telemetry.

Why both: the telemetry layer may be absent (a plain script, or before it is
installed), yet a caller tuning its loop still wants the numbers, so every pull
returns a :class:`Version` (an ``int`` carrying ``.stats``) and every publish a
:class:`PublishStats`. Telemetry is reached through a guarded import and never fails
a sync.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from rlmesh import telemetry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishStats:
    name: str
    version: int
    bytes: int
    seconds: float
    copy_seconds: float
    slot: int


@dataclass(frozen=True)
class SyncStats:
    """One pull. ``dropped``: the version asked for was no longer kept, so the newest was delivered."""

    name: str
    version: int
    bytes: int
    seconds: float
    transport: str
    reader: str
    fetch_seconds: float = 0.0
    verify_seconds: float = 0.0
    copy_seconds: float = 0.0
    requested: int | None = None
    dropped: bool = False

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class Version(int):
    """The version number a pull delivered, with the pull's :class:`SyncStats` as ``.stats``."""

    stats: SyncStats

    def __new__(cls, value: int, stats: SyncStats) -> "Version":
        obj = super().__new__(cls, value)
        obj.stats = stats
        return obj

    def __reduce__(self) -> tuple:
        # int subclasses pickle through int.__getnewargs__ (the value only): pass stats too,
        # or a Version returned by an endpoint could not be rebuilt in the caller.
        return (Version, (int(self), self.stats))


def _record(table: str, **row: object) -> None:
    try:
        telemetry.record(table, **row)
    except Exception:
        logger.debug("telemetry.record(%r) failed; the sync itself succeeded", table, exc_info=True)


def record_sync(s: SyncStats, ok: bool = True) -> None:
    """One ``weight_syncs`` row (columns as declared by ``rlmesh.telemetry.schema``, plus ``reader``/``seconds``)."""
    _record("weight_syncs", name=s.name, version=s.version, transport=s.transport.replace("-", "_"), bytes=s.bytes,
            duration_s=s.seconds, seconds=s.seconds, ok=ok, reader=s.reader)


def record_publish(s: PublishStats) -> None:
    logger.debug("weights %r: published version %d (%d bytes, %.3fs)", s.name, s.version, s.bytes, s.seconds)


def as_dict(s: SyncStats | PublishStats) -> dict[str, object]:
    return asdict(s)
