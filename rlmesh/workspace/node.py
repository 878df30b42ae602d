"""One receiver as its own process: ``python -m rlmesh.workspace.node --upstream ADDR --store DIR --dest DIR``.

Prints its own serve address (a downstream host dials it) as the first line, then
one JSON line of :class:`WorkspaceSyncStats` when its pull is done, and keeps serving until
stdin closes. Why a process: tests and ``benchmarks/workspace_sync.py`` simulate N
hosts as N of these, each with its own store and destination. Needs ``RLMESH_SECRET``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from rlmesh.workspace.onesided import ChunkTransport
from rlmesh.workspace.store import ChunkStore
from rlmesh.workspace.transfer import Receiver


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstream", required=True, help="address to pull from; '-': read it from stdin after "
                    "printing ours (all receivers of a chain start first, as a mesh's procs already run)")
    ap.add_argument("--store", required=True)
    ap.add_argument("--dest", required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--host", default=None, help="address to serve downstream on (default: loopback); off "
                    "loopback the channel is CurveZMQ, as between real hosts")
    ap.add_argument("--transport", default=None, choices=[t.value for t in ChunkTransport],
                    help="how chunks come from upstream (default: RLMESH_WORKSPACE_TRANSPORT, else auto)")
    a = ap.parse_args(argv)
    rx = Receiver(ChunkStore(a.store), a.dest, host=a.host, transport=a.transport)
    print(rx.addr, flush=True)
    upstream = sys.stdin.readline().strip() if a.upstream == "-" else a.upstream
    try:
        st = rx.pull(upstream, a.timeout)
        print(json.dumps(dataclasses.asdict(st)), flush=True)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    finally:
        sys.stdin.read()  # serve downstream until the parent closes our stdin
        rx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
