"""Where subscribers find publishers: a small seam over the runtime's control-plane KV store.

Why a seam: inside a job the runtime's KV (``rlmesh.actor.kv``) is shared by the
controller and every worker, which is exactly the rendezvous weight sync needs. Plain
scripts, unit tests and benchmarks run without a runtime, so :class:`FileDirectory`
offers the same four calls over JSON files in a folder that several processes share
(``RLMESH_WEIGHTS_DIRECTORY=/some/dir`` selects it for every Publisher/Subscriber).

Records are plain JSON-able dicts; nothing read from here is unpickled.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from rlmesh import settings
from rlmesh.actor import kv
from rlmesh.actor.context import current_context, current_proc, job_id
from rlmesh.files import write_atomically

DIRECTORY_ENV = settings.WEIGHTS_DIRECTORY.name
KEY_PREFIX = "rlmesh/weights/"


class Directory(Protocol):
    def put(self, key: str, value: Any) -> None: ...
    def get(self, key: str, timeout: float | None) -> Any: ...
    def delete(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...


class KVDirectory:
    """The runtime's KV (late-bound: whichever backend the runtime installed when each call runs)."""

    def put(self, key: str, value: Any) -> None:
        kv.put(key, value)

    def get(self, key: str, timeout: float | None) -> Any:
        return kv.get(key, timeout)

    def delete(self, key: str) -> None:
        kv.delete(key)

    def keys(self, prefix: str) -> list[str]:
        return kv.keys(prefix)


class FileDirectory:
    """JSON files in one folder; ``put`` is atomic (write then rename), ``get`` polls."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / (urllib.parse.quote(key, safe="") + ".json")

    def put(self, key: str, value: Any) -> None:
        path = self._path(key)
        write_atomically(path, json.dumps(value))

    def get(self, key: str, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        path = self._path(key)
        while True:
            try:
                return json.loads(path.read_text())
            except FileNotFoundError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                raise KeyError(f"kv key {key!r} not present after {timeout}s")
            time.sleep(0.01)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def keys(self, prefix: str) -> list[str]:
        out = []
        for p in self.root.glob("*.json"):
            key = urllib.parse.unquote(p.name[: -len(".json")])
            if key.startswith(prefix):
                out.append(key)
        return sorted(out)


def default_directory() -> Directory:
    root = settings.WEIGHTS_DIRECTORY.get()
    return FileDirectory(root) if root else KVDirectory()


def publisher_key(name: str) -> str:
    return f"{KEY_PREFIX}{name}"


# ---- identity of this process: used to pick shm vs tcp and to name segments ----

_SAFE = re.compile(r"[^A-Za-z0-9.]+")


def safe(part: str) -> str:
    """A name component without ``-`` or ``/`` so segment names split unambiguously."""
    return _SAFE.sub("_", part) or "_"


def this_host() -> str:
    proc = current_proc()
    return proc.host if proc is not None else socket.gethostname()


def this_proc_id() -> str:
    """The runtime's proc id in a worker; ``pid<N>`` in a plain process."""
    proc = current_proc()
    return proc.proc_id if proc is not None else f"pid{os.getpid()}"


def this_job() -> str:
    return job_id() or "local"


def reader_id() -> str:
    """How a reader names itself in telemetry: ``mesh[rank]`` inside an actor, else its proc id."""
    ctx = current_context()
    if ctx is not None:
        return f"{ctx.mesh_name}[{ctx.rank}]"
    return this_proc_id()
