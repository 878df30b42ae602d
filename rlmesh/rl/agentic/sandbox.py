"""The subprocess side of an isolated tool call (``python -m rlmesh.rl.agentic.sandbox``).

Reads ``{"target": "module:qualname", "args", "memory_mb", "network"}`` as JSON on stdin,
limits itself, calls the function and writes ``{"output"}`` or ``{"error"}`` as one JSON line.
The memory limit is ``memory_mb`` of address space *beyond* what the interpreter and the tool's
module map once imported: a module that imports torch maps ~650 MB of address space before the
call allocates anything, so a flat ``RLIMIT_AS`` of 512 MB failed every allocation of such a tool.
Run by :func:`rlmesh.rl.agentic.tools.run_tool`, never by hand.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import resource
import socket
import sys
from typing import Any

CLONE_NEWNET = 0x40000000


def _no_network() -> None:
    """A new, empty network namespace where allowed (root / user namespaces); else refuse sockets
    at the Python level (a tool in C could still connect then: the docs say so)."""
    try:
        if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) == 0:
            return
    except (OSError, AttributeError):
        pass

    def refuse(*_a: object, **_k: object) -> None:
        raise PermissionError("network access is disabled in the rlmesh tool sandbox (ToolLimits.network)")

    allowed = {socket.AF_UNIX}

    class _Socket(socket.socket):
        def __init__(self, family: int = socket.AF_INET, *a: Any, **k: Any) -> None:
            if family not in allowed:
                refuse()
            super().__init__(family, *a, **k)

    socket.socket = _Socket  # type: ignore[misc]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]


def _mapped_bytes() -> int:
    """This process's address space now (``VmSize``), 0 where ``/proc`` does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    req = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not req.get("network"):
        _no_network()
    module, _, qualname = req["target"].partition(":")
    fn: object = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    limit = _mapped_bytes() + int(req["memory_mb"]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        reply = {"output": str(fn(req["args"]))}  # type: ignore[operator]
    except MemoryError:
        raise  # the parent reads MemoryError from stderr and reports the memory limit
    except Exception as exc:  # noqa: BLE001 - a tool's failure is an observation
        reply = {"error": f"exception: {type(exc).__name__}: {exc}"[:300]}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
