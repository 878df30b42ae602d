"""``sync_workspace(procs, path)``: the controller's tree to every host of a mesh, importable before actors exist.

Why actors: each host's receiver runs as a small :class:`WorkspaceAgent` on one proc of
that host (the mesh's own authenticated control plane starts it and reports back),
then every proc of the host puts the landed tree first on ``sys.path`` (and, with
``chdir=True``, makes it the working directory). A host that is the controller's own
host receives nothing: its procs use ``path`` itself (same filesystem, no copy).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
import threading
import time
from typing import Any

from rlmesh import telemetry
from rlmesh.actor import Actor, endpoint
from rlmesh.actor.shape import Shape
from rlmesh.workspace.manifest import build_manifest
from rlmesh.workspace.store import DEFAULT_STORE, ChunkStore
from rlmesh.workspace.transfer import ChunkServer, Receiver, SyncStats, source_lookup

logger = logging.getLogger(__name__)
_seq = iter(range(1, 1 << 30))


class WorkspaceAgent(Actor):
    """One per proc: receives (on one proc per host) and activates the tree (on all of them)."""

    def __init__(self) -> None:
        self._rx: Receiver | None = None
        self._done = threading.Event()
        self._stats: SyncStats | None = None
        self._error = ""

    @endpoint
    def start(self, upstream: str, store: str, dest: str, timeout: float) -> str:
        """Begin pulling from ``upstream`` in the background; returns this host's serve address."""
        self._rx = Receiver(ChunkStore(store), dest)

        def run() -> None:
            try:
                self._stats = self._rx.pull(upstream, timeout)
            except Exception as exc:  # reported by wait(), with the error in the stats row
                self._error = f"{type(exc).__name__}: {exc}"
                self._stats = self._rx.last
            self._done.set()

        threading.Thread(target=run, name="rlmesh-workspace-pull", daemon=True).start()
        return self._rx.addr

    @endpoint
    def wait(self) -> dict[str, Any]:
        self._done.wait()
        return {**dataclasses.asdict(self._stats or SyncStats()), "error": self._error}

    @endpoint
    def finish(self) -> None:
        if self._rx is not None:
            self._rx.close()
            self._rx = None

    @endpoint
    def activate(self, dest: str, chdir: bool) -> str:
        """Make ``dest`` importable here (first on ``sys.path``) and, optionally, the working directory."""
        if dest in sys.path:
            sys.path.remove(dest)
        sys.path.insert(0, dest)
        importlib.invalidate_caches()
        if chdir:
            os.chdir(dest)
        return dest


@dataclasses.dataclass
class HostSync:
    """One host's outcome (one ``file_syncs`` row)."""

    host: str
    dest: str
    stats: SyncStats


def sync_workspace(procs: Any, path: str = ".", exclude: tuple[str, ...] | list[str] = (), *,
                   store_dir: str = DEFAULT_STORE, dest_root: str | None = None, run_id: str = "",
                   simulate_hosts: bool = False, chdir: bool = False, timeout: float = 120.0) -> list[HostSync]:
    """Land ``path`` on every host of ``procs`` (a ProcMesh) and make it importable by all its procs.

    ``simulate_hosts=True`` treats every proc as its own host (own store ``store_dir/host-i``
    and destination): how tests and benchmarks exercise the chain on one machine.
    Hosts are fed along a chain (source -> host0 -> host1 ...), each forwarding chunks as they arrive.
    Raises ``RuntimeError`` naming the host when a host's sync failed.
    """
    root = os.path.abspath(path)
    run_id = run_id or f"ws-{os.getpid()}-{next(_seq)}"
    dest_root = dest_root or os.path.join(os.path.expanduser("~"), ".cache", "rlmesh", "workspaces")
    shape = Shape(procs.shape)
    agents = procs.spawn(f"_workspace_{run_id}", WorkspaceAgent)
    recs = procs._records()
    me = os.uname().nodename
    hosts: dict[str, list[int]] = {}
    for rank, rec in enumerate(recs):
        key = f"proc-{rank}" if simulate_hosts else (rec.host or me)
        hosts.setdefault(key, []).append(rank)

    def one(rank: int) -> Any:
        return agents.slice(**shape.coords(rank))

    manifest = build_manifest(root, exclude)
    server = ChunkServer(manifest.to_json(), source_lookup(root, manifest))
    out: list[HostSync] = []
    try:
        chain, up = [], server.addr
        for i, (host, ranks) in enumerate(hosts.items()):
            if host == me and not simulate_hosts:
                out.append(HostSync(host, root, SyncStats(files=len(manifest.entries), transport="same-host")))
                continue
            dest = os.path.join(dest_root, f"host-{i}" if simulate_hosts else "", run_id)
            store = os.path.join(store_dir, f"host-{i}") if simulate_hosts else store_dir
            up = one(ranks[0]).start.call_one(up, store, dest, timeout).get()
            chain.append((host, ranks, dest))
        for host, ranks, dest in chain:
            st = one(ranks[0]).wait.call_one().get()
            out.append(HostSync(host, dest, SyncStats(**st)))
            if st["error"]:
                raise RuntimeError(f"workspace sync to host {host} failed: {st['error']} (stored chunks are kept; "
                                   "call sync_workspace again to resume)")
        for host, ranks, dest in chain:
            one(ranks[0]).finish.call_one().get()
        dests = {r: hs.dest for hs in out for r in hosts[hs.host]}
        for rank, dest in dests.items():
            one(rank).activate.call_one(dest, chdir).get()
    finally:
        server.close()
    _record(out, run_id)
    return out


def _record(rows: list[HostSync], sync_id: str) -> None:
    """One ``file_syncs`` row per host, when telemetry is running in this process."""
    for hs in rows:
        s = hs.stats
        try:
            telemetry.record("file_syncs", sync_id=sync_id, target_host=hs.host, dest=hs.dest, files=s.files,
                             files_sent=s.files_written, files_skipped=s.files_skipped, bytes_total=s.bytes_total,
                             bytes_sent=s.bytes_received, chunks_sent=s.chunks_received,
                             chunks_deduplicated=s.chunks_deduplicated, transport=s.transport,
                             duration_s=s.duration_s, error=s.error)
        except Exception:
            logger.debug("file_syncs row not recorded", exc_info=True)
