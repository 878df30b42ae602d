"""The states of a proc as the controller's supervisor tracks them (``ProcRecord.state``).

A ``StrEnum``: members compare equal to their strings (``"alive"``), so logs, telemetry rows and
``ProcMesh.states()`` read the same as before, while code names the closed set instead of spelling it.
"""

from __future__ import annotations

from enum import StrEnum


class ProcState(StrEnum):
    STARTING = "starting"
    """Launched; its worker has not registered yet."""
    REJOINING = "rejoining"
    """A worker that lost the controller dials back in."""
    ALIVE = "alive"
    """Registered and heartbeating: serves calls."""
    RESTARTING = "restarting"
    """Dead; a replacement is scheduled (``Restart`` policy)."""
    STOPPING = "stopping"
    """Asked to stop; waiting for it to exit."""
    DEAD = "dead"
    """Exited or stopped answering, no restart (yet) decided."""
    FAILED = "failed"
    """Dead for good: its restarts are used up."""
    STOPPED = "stopped"
    """Stopped on purpose."""


ENDED = frozenset({ProcState.DEAD, ProcState.FAILED, ProcState.STOPPED})
"""States a proc does not come back from by itself."""
