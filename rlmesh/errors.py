"""The small error hierarchy every rlmesh layer raises from. Messages say what, why and the fix."""

from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass

from rlmesh import settings
from rlmesh.transport.serialization import SerializationError


class RlmeshError(Exception):
    """Base class of rlmesh's own errors."""


class ConfigError(RlmeshError, ValueError):
    """A bad setting: the message names the key and how to fix it."""


class ActorError(RlmeshError):
    """An endpoint (or an actor's ``__init__``) raised in a remote proc.

    Carries the actor mesh name, rank and endpoint, the remote exception type and
    its traceback (also in ``str(err)``). ``exception`` is the original exception
    object when it could be pickled back, else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        mesh: str = "",
        rank: int = -1,
        endpoint: str = "",
        remote_type: str = "",
        remote_traceback: str = "",
        exception: BaseException | None = None,
    ):
        self.mesh = mesh
        self.rank = rank
        self.endpoint = endpoint
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
        self.exception = exception
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        where = f"{self.mesh}[{self.rank}].{self.endpoint}" if self.mesh else "actor"
        text = f"{where}: {self.message}"
        if self.remote_traceback:
            text += f"\n\nRemote traceback ({where}):\n{self.remote_traceback.rstrip()}"
        return text

    def __reduce__(self):
        return (_rebuild_actor_error, (type(self), self.message, self.mesh, self.rank, self.endpoint,
                                       self.remote_type, self.remote_traceback, self.__dict__.get("exit_code"),
                                       self.__dict__.get("signal")))


def _rebuild_actor_error(cls, message, mesh, rank, endpoint, remote_type, remote_tb, exit_code=None, signal=None):
    if issubclass(cls, ActorDied):
        return cls(message, mesh=mesh, rank=rank, endpoint=endpoint, exit_code=exit_code, signal=signal)
    return cls(message, mesh=mesh, rank=rank, endpoint=endpoint, remote_type=remote_type,
               remote_traceback=remote_tb)


class ActorDied(ActorError):
    """The proc hosting the actor exited, was killed, or stopped answering heartbeats.

    ``exit_code`` / ``signal`` say how, when known. Every pending and later call to
    that incarnation fails with this; with a ``Restart`` policy, calls issued after
    the replacement joins succeed.
    """

    def __init__(self, message: str, *, mesh: str = "", rank: int = -1, endpoint: str = "",
                 exit_code: int | None = None, signal: int | None = None):
        self.exit_code = exit_code
        self.signal = signal
        super().__init__(message, mesh=mesh, rank=rank, endpoint=endpoint, remote_type="ActorDied")


class CallTimeout(ActorError, TimeoutError):
    """An endpoint call set ``.options(timeout=...)`` and no answer came in time."""


class WeightSyncError(RlmeshError):
    """A weight transfer was torn, corrupt or did not match the target; the target was left untouched."""


_STORAGE = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
            errno.EROFS: "Read-only file system", errno.EACCES: "Permission denied"}


@dataclass(frozen=True)
class StorageProblem:
    """A write the disk refused: full, over quota, read-only, or not ours to write. ``str()`` is
    one line naming it, the path (when known) and the fix."""

    errno: int
    path: str | None = None

    def __str__(self) -> str:
        what = _STORAGE[self.errno].lower()
        where = f" writing {self.path}" if self.path else ""
        full = self.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = {errno.ENOSPC: "free space on that disk", errno.EDQUOT: "free space within your quota",
               errno.EROFS: "remount it read-write", errno.EACCES: "get write access to it"}[self.errno]
        runs = os.path.abspath(settings.RUNS_DIR.get())
        if self.path is None or os.path.abspath(self.path).startswith(runs + os.sep) or self.path == runs:
            fix += (", or set RLMESH_RUNS_DIR (telemetry.runs_dir=) to a folder "
                    + ("on another disk" if full else "you can write"))
        return f"{what}{where}: {fix}"


def storage_problem(exc: BaseException | None) -> StorageProblem | None:
    """The full, read-only or unwritable disk behind ``exc`` (its causes, a remote error's text and
    DuckDB's messages included), else None. Why: such an error is the operator's to fix, in one
    line; its traceback says nothing they can act on."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE:
            return StorageProblem(e.errno, None if e.filename is None else str(e.filename))
        text = e.message if isinstance(e, ActorError) else str(e)
        for no, words in _STORAGE.items():
            if words in text:
                m = re.search(rf"{words}: '([^']+)'", text) or re.search(rf'"([^"]+)": {words}', text)
                return StorageProblem(no, m.group(1) if m else None)
        todo += [e.__cause__, e.__context__]
    return None


class QuietStorageErrors(logging.Filter):
    """On a handler: a record whose exception is a :func:`storage_problem` loses its traceback and
    says the problem instead, once per process; later ones are dropped (after a disk fills, every
    writer of the run fails the same way, each with its traceback)."""

    def __init__(self) -> None:
        super().__init__()
        self._told: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        problem = storage_problem(exc) if exc is not None else None
        if problem is None:
            return True
        if problem.errno in self._told:
            return False
        self._told.add(problem.errno)
        record.msg, record.args = f"{record.getMessage()}: {problem}", ()
        record.exc_info, record.exc_text = None, None
        return True


def quiet_storage_tracebacks() -> None:
    """Put one :class:`QuietStorageErrors` on each of the root logger's handlers (a process's entry point)."""
    quiet = QuietStorageErrors()
    for h in logging.getLogger().handlers:
        if not any(isinstance(f, QuietStorageErrors) for f in h.filters):
            h.addFilter(quiet)


__all__ = [
    "StorageProblem",
    "ActorDied",
    "ActorError",
    "CallTimeout",
    "ConfigError",
    "RlmeshError",
    "SerializationError",
    "WeightSyncError",
    "quiet_storage_tracebacks",
    "storage_problem",
]
