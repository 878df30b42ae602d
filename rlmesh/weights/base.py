"""What every reader transport provides to :class:`rlmesh.weights.Subscriber`.

Why a tiny interface: transports differ only in how bytes reach this process. Each
one answers "which versions exist" and "give me verified-able views of version v",
and the Subscriber does the rest (waiting, verifying, copying, telemetry) once, so
every transport passes the same test suite by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rlmesh.weights.layout import Manifest


@dataclass
class Fetched:
    """One version held for reading: per entry its pieces, and how to let go of it."""

    manifest: Manifest
    sources: list[list[Any]]
    release: Callable[[], None] = field(default=lambda: None)
    fetch_seconds: float = 0.0
    sums: list[int] | None = None  # per-entry checksums of the received bytes, when computed on arrival
    adopt: Callable[[], None] | None = None
    """Set by a transport whose sources live in a private staging buffer (TCP): the Subscriber may
    point a module's tensors at the verified sources instead of copying them, then calls this so the
    transport never writes that buffer again while anything still uses it."""


class ReaderTransport(Protocol):
    name: str

    def versions(self) -> list[int]:
        """Versions readable now, newest first; raises ``WeightSyncError`` if the publisher is gone."""
        ...

    def fetch(self, min_version: int, version: int | None, timeout: float) -> Fetched | None:
        """Hold the newest version >= ``min_version`` (or exactly ``version`` while kept); ``None`` if none yet."""
        ...

    def close(self) -> None: ...
