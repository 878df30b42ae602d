"""A small key-value store on the control plane, for rendezvous between actors.

Why: a weight publisher in the trainer must tell subscribers in generators where
its shared-memory segments or sockets are, and RDMA peers must swap queue-pair
info, without either side knowing the other's address in advance. The controller
holds the table; workers reach it over their control connection. In a process
with no runtime (unit tests, a plain script) the table is local to the process.

    kv.put("weights/policy", {"addr": ..., "version": 3})
    info = kv.get("weights/policy", timeout=30)   # blocks until present
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol


class KVBackend(Protocol):
    def put(self, key: str, value: Any) -> None: ...
    def get(self, key: str, timeout: float | None) -> Any: ...
    def delete(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...


class LocalKV:
    """Process-local table with blocking ``get``; also the controller's authoritative store."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._cv = threading.Condition()

    def put(self, key: str, value: Any) -> None:
        with self._cv:
            self._data[key] = value
            self._cv.notify_all()

    def get(self, key: str, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while key not in self._data:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise KeyError(f"kv key {key!r} not present after {timeout}s")
                self._cv.wait(left)
            return self._data[key]

    def get_nowait(self, key: str) -> Any:
        with self._cv:
            return self._data[key]

    def delete(self, key: str) -> None:
        with self._cv:
            self._data.pop(key, None)

    def keys(self, prefix: str = "") -> list[str]:
        with self._cv:
            return sorted(k for k in self._data if k.startswith(prefix))


_backend: KVBackend = LocalKV()


def set_backend(backend: KVBackend) -> None:
    """Installed by the runtime: the controller's table in the controller, a remote client in workers."""
    global _backend
    _backend = backend


def put(key: str, value: Any) -> None:
    """Store a picklable value under ``key`` (overwrites)."""
    _backend.put(key, value)


def get(key: str, timeout: float | None = None) -> Any:
    """Value under ``key``; waits up to ``timeout`` seconds for it to appear (``None`` = forever), else ``KeyError``."""
    return _backend.get(key, timeout)


def delete(key: str) -> None:
    _backend.delete(key)


def keys(prefix: str = "") -> list[str]:
    return _backend.keys(prefix)
