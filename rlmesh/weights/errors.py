"""Errors of weight sync. Each message says what went wrong and what to do about it."""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """A pull could not deliver a complete, verified version.

    Raised for corrupt or torn transfers (checksum mismatch), a publisher that went
    away, or a timeout. The pull target is left untouched whenever this is raised.
    """


class StateDictMismatchError(WeightSyncError, ValueError):
    """The pulled version and the target state_dict disagree on keys, shapes or dtypes.

    ``key`` is the first offending key (in the target's order, then the publisher's).
    """

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


class TransportUnavailableError(WeightSyncError):
    """A transport was forced (``transport="rdma"`` ...) but cannot run between these two procs."""
