"""Errors of weight sync. Each message says what went wrong and what to do about it."""

from __future__ import annotations

# One class for the whole framework: ``rm.WeightSyncError`` catches every error raised here.
from rlmesh.errors import WeightSyncError


class StateDictMismatchError(WeightSyncError, ValueError):
    """The pulled version and the target state_dict disagree on keys, shapes or dtypes.

    ``key`` is the first offending key (in the target's order, then the publisher's).
    """

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


class TransportUnavailableError(WeightSyncError):
    """A transport was forced (``transport="rdma"`` ...) but cannot run between these two procs."""


__all__ = ["StateDictMismatchError", "TransportUnavailableError", "WeightSyncError"]
