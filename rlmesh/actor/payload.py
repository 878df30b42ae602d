"""Which modules a pickled actor payload needs: read from the pickle stream without unpickling it.

Why in the runtime: the controller builds these payloads (class plus arguments, via
:func:`rlmesh.transport.serialization.dumps`) and tells launchers that keep warm
templates (the local fork server) which modules to import ahead of a restart. The
runtime computes the names and passes plain strings to ``Launcher.preload``; it never
imports a launcher to do so.
"""

from __future__ import annotations

import pickletools
from typing import Any

SKIP_PRELOAD = {"__main__", "builtins", "copyreg", "_codecs"}


def modules_in_payload(payload: Any, max_ops: int = 50_000) -> list[str]:
    """Names of the modules a pickled actor payload references by name (classes shipped by value add none).

    ``payload`` is what :func:`rlmesh.transport.serialization.dumps` returns (its
    first buffer is the pickle stream). Unreadable payloads give ``[]``. Only the first
    ``max_ops`` opcodes are read: the class comes first, big arguments need not be walked.
    """
    try:
        data = bytes(payload[0] if isinstance(payload, (list, tuple)) else payload)
        found: list[str] = []
        memo: dict[int, Any] = {}
        recent: list[Any] = []  # the values pushed by the last ops (strings, or None for anything else)
        for n, (op, arg, _) in enumerate(pickletools.genops(data)):
            if n >= max_ops:
                break
            name = op.name
            if name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
                recent.append(arg)
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
                continue
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                recent.append(memo.get(int(arg)))  # type: ignore[arg-type]  # a GET's argument is the memo index
            elif name == "STACK_GLOBAL":
                if len(recent) >= 2 and isinstance(recent[-2], str):
                    found.append(recent[-2])
                recent.append(None)
            elif name == "GLOBAL":
                found.append(str(arg).split(" ", 1)[0])
                recent.append(None)
            else:
                recent.append(None)
            del recent[:-2]
        return [m for m in dict.fromkeys(found) if m and m not in SKIP_PRELOAD]
    except Exception:  # noqa: BLE001 - preloading is an optimisation only
        return []
