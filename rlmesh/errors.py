"""The small error hierarchy every rlmesh layer raises from. Messages say what, why and the fix."""

from __future__ import annotations

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


__all__ = [
    "ActorDied",
    "ActorError",
    "CallTimeout",
    "ConfigError",
    "RlmeshError",
    "SerializationError",
    "WeightSyncError",
]
