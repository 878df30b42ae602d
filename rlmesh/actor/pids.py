"""Is a process still there? The two answers the runtime needs, in one place.

Why two: a proc that watches its parent only needs to know whether the pid exists (:func:`pid_exists`);
a supervisor that waits for a child or a creator to end must count a zombie, dead but not yet reaped,
as gone (:func:`pid_running`), or it would wait on the dead for ever.
"""

from __future__ import annotations

import os

__all__ = ["pid_exists", "pid_running"]


def pid_exists(pid: int) -> bool:
    """True while ``pid`` exists (a zombie included); a process of another user that we may not signal
    counts as existing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_running(pid: int) -> bool:
    """True while ``pid`` runs: as :func:`pid_exists`, but a zombie counts as gone."""
    if not pid_exists(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True
