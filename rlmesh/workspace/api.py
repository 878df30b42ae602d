"""``sync_workspace(procs, path)``: the controller's tree to every host of a mesh, importable before actors exist.

Why actors: each host's receiver runs as a small :class:`WorkspaceAgent` on one proc of
that host (the mesh's own authenticated control plane starts it and reports back),
then every proc of the host puts the landed tree first on ``sys.path`` (and, with
``chdir=True``, makes it the working directory). A host that is the controller's own
host receives nothing: its procs use ``path`` itself (same filesystem, no copy).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from rlmesh import telemetry
from rlmesh.actor import Actor, endpoint
from rlmesh.actor.proc_state import ProcState
from rlmesh.actor.shape import Shape
from rlmesh.errors import ActorError
from rlmesh.launch.forkserver import FRESH_IMPORTS_ENV
from rlmesh.workspace.editable import EditableRoot, editable_roots
from rlmesh.workspace.manifest import Kind, TreeManifest, build_manifest, with_extras
from rlmesh.workspace.reload import ProcReload, ReloadMode, reload_changed
from rlmesh.workspace.store import DEFAULT_STORE, ChunkStore
from rlmesh.workspace.onesided import ChunkTransport, transport_from_env
from rlmesh.workspace.serve import ChunkServer, source_lookup
from rlmesh.workspace.transfer import Receiver, WorkspaceSyncStats

logger = logging.getLogger(__name__)
_seq = iter(range(1, 1 << 30))


class _Pull:
    """One sync's pull on this host: its receiver, and how it ended (set once, by its thread)."""

    def __init__(self, rx: Receiver) -> None:
        self.rx = rx
        self.done = threading.Event()
        self.stats: WorkspaceSyncStats | None = None
        self.error = ""
        self.closed = False

    def run(self, upstream: str, timeout: float) -> None:
        try:
            self.stats = self.rx.pull(upstream, timeout)
        except BaseException as exc:  # reported by wait(), with the error in the stats row; never as success
            self.error = f"{type(exc).__name__}: {exc}"
            self.stats = getattr(self.rx, "last", None)
        finally:
            if not self.error and self.stats is None:
                self.error = "the pull ended without a result"
            self.done.set()


class WorkspaceAgent(Actor):
    """One per proc: receives (on one proc per host) and activates the tree (on all of them).

    Each :meth:`start` is one sync with a receiver of its own (a new ``dest_root`` included);
    :meth:`wait` reports that sync, never an earlier one's outcome."""

    def __init__(self) -> None:
        self._pull: _Pull | None = None

    @endpoint
    def start(self, upstream: str, store: str, dest: str, timeout: float, transport: str | None = None) -> str:
        """Begin pulling from ``upstream`` in the background; returns this host's serve address.
        ``transport``: a :class:`~rlmesh.workspace.onesided.ChunkTransport` value (None: this host's env)."""
        prev = self._pull
        if prev is not None and not prev.done.wait(timeout):
            raise RuntimeError(f"this host's previous workspace pull is still running after {timeout:.0f}s; "
                               "wait for that sync_workspace call to return, then sync again")
        self._close()
        pull = self._pull = _Pull(Receiver(ChunkStore(store), dest, transport=transport))
        threading.Thread(target=pull.run, args=(upstream, timeout), name="rlmesh-workspace-pull", daemon=True).start()
        return pull.rx.addr

    @endpoint
    def relink(self, upstream: str) -> None:
        """The host before this one in the chain died: continue the pull from ``upstream`` (its upstream)."""
        if self._pull is not None:
            self._pull.rx.relink(upstream)

    @endpoint
    def wait(self) -> dict[str, Any]:
        pull = self._pull
        if pull is None:
            return {**dataclasses.asdict(WorkspaceSyncStats()), "error": "RuntimeError: no pull was started on this host"}
        pull.done.wait()
        return {**dataclasses.asdict(pull.stats or WorkspaceSyncStats()), "error": pull.error}

    @endpoint
    def finish(self) -> None:
        self._close()

    def _close(self) -> None:
        """The last pull's serving end (once that pull is over: never under a running pull)."""
        pull = self._pull
        if pull is not None and pull.done.is_set() and not pull.closed:
            pull.closed = True
            pull.rx.close()

    @endpoint
    def activate(self, dirs: list[str], cwd: str, chdir: bool) -> str:
        """Put ``dirs`` first on ``sys.path`` (in order) and, optionally, make ``cwd`` the working directory."""
        for d in reversed(dirs):
            if d in sys.path:
                sys.path.remove(d)
            sys.path.insert(0, d)
        importlib.invalidate_caches()
        if chdir:
            os.chdir(cwd)
        return cwd

    @endpoint
    def reload(self, roots: list[str], files: list[str]) -> ProcReload:
        """Reload this proc's changed modules where safe (:func:`rlmesh.workspace.reload.reload_changed`)."""
        return reload_changed(roots, files)


@dataclasses.dataclass
class HostSync:
    """One host's outcome (one ``file_syncs`` row), and what its procs did with the changes."""

    host: str
    dest: str
    stats: WorkspaceSyncStats
    reloads: list[ProcReload] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _MeshState:
    """Per ProcMesh (by its procs): the agents, spawned once, and the last manifest synced per root."""

    agents: Any
    recs: list[Any]
    last: dict[str, TreeManifest] = dataclasses.field(default_factory=dict)


_meshes: dict[tuple[int, tuple[str, ...]], _MeshState] = {}


def _mesh_state(procs: Any) -> _MeshState:
    """The mesh's agents; new ones when these procs are not the ones they were spawned on (a mesh
    stopped and another started under the same proc ids)."""
    recs = procs._records()
    key = (id(procs._controller), tuple(r.proc_id for r in recs))
    st = _meshes.get(key)
    if st is None or any(a is not b for a, b in zip(st.recs, recs)):
        agents = procs.spawn(f"_workspace_{os.getpid()}_{next(_seq)}", WorkspaceAgent)
        st = _meshes[key] = _MeshState(agents, list(recs))
    return st


def _changed(old: TreeManifest | None, new: TreeManifest) -> list[str]:
    """Files added or different since ``old`` (all files when there was none)."""
    before = {e.path: e for e in old.entries} if old else {}
    return [e.path for e in new.entries if e.kind == Kind.FILE and before.get(e.path) != e]


def sync_workspace(procs: Any, path: str = ".", exclude: tuple[str, ...] | list[str] = (), *,
                   store_dir: str = DEFAULT_STORE, dest_root: str | None = None, run_id: str = "",
                   simulate_hosts: bool = False, chdir: bool = False, editable: bool = True,
                   reload: bool | str | ReloadMode = ReloadMode.OFF, timeout: float = 120.0,
                   transport: ChunkTransport | str | None = None) -> list[HostSync]:
    """Land ``path`` on every host of ``procs`` (a ProcMesh) and make it importable by all its procs.

    ``simulate_hosts=True`` treats every proc as its own host (own store ``store_dir/host-i``
    and destination): how tests and benchmarks exercise the chain on one machine.
    Hosts are fed along a chain (source -> host0 -> host1 ...), each forwarding chunks as they arrive.
    ``editable``: also sync the folders of the controller's editable installs (:mod:`.editable`).
    ``reload`` (``True`` = ``"auto"``): what running procs do with changed modules (:mod:`.reload`).
    The same ``path`` synced again to the same procs lands in the same destination (``run_id``
    defaults to one per controller process and root). Raises ``RuntimeError`` naming the host when
    a host's sync failed. ``transport`` (default ``RLMESH_WORKSPACE_TRANSPORT``, else ``auto``): how
    chunks cross each link (:class:`~rlmesh.workspace.onesided.ChunkTransport`; RDMA READs where both
    hosts of a link have a device, TCP otherwise); each host's ``file_syncs`` row says which it used.
    """
    transport = ChunkTransport(transport) if transport is not None else transport_from_env()
    mode = ReloadMode.AUTO if reload is True else ReloadMode.OFF if reload is False else ReloadMode(reload)
    root = os.path.abspath(path)
    run_id = run_id or f"ws-{os.getpid()}-{hashlib.blake2b(root.encode(), digest_size=4).hexdigest()}"
    dest_root = dest_root or os.path.join(os.path.expanduser("~"), ".cache", "rlmesh", "workspaces")
    shape = Shape(procs.shape)
    state = _mesh_state(procs)
    agents = state.agents
    recs = procs._records()
    me = os.uname().nodename
    hosts: dict[str, list[int]] = {}
    for rank, rec in enumerate(recs):
        key = f"proc-{rank}" if simulate_hosts else (rec.host or me)
        hosts.setdefault(key, []).append(rank)

    def one(rank: int) -> Any:
        return agents.slice(**shape.coords(rank))

    inside, extras = [], []
    for er in (editable_roots() if editable else []):
        rel = os.path.relpath(er.root, root)
        if rel == "." or not (rel == ".." or rel.startswith(".." + os.sep)):
            inside.append(rel.replace(os.sep, "/"))  # already in the tree: only its sys.path entry
        else:
            extras.append(er)
    lookup = source_lookup(root, None, {er.prefix: er.root for er in extras})

    def walk() -> TreeManifest:
        main = build_manifest(root, exclude, held=lookup.held, on_hint=server.hint if overlap else None)
        extra = [(er.prefix, build_manifest(er.root, chunk_bytes=main.chunk_bytes, held=lookup.held,
                                            on_hint=server.hint if overlap else None)) for er in extras]
        return with_extras(main, extra) if extra else main

    # The hosts start first and fetch the small files as the walk hashes them (ChunkServer's hints): on a quiet
    # machine that took 10,000 files to a simulated host in 0.29-0.33 s against 0.36-0.37 s walk-first (only on
    # two cores loaded by other work, load 4, did it lose: 0.42-0.45 against 0.36-0.39 s).
    overlap = any(host != me or simulate_hosts for host in hosts)
    server = ChunkServer(None, lookup, walking=overlap)
    out: list[HostSync] = []
    manifest: TreeManifest | None = None
    try:
        if not overlap:
            manifest = lookup.manifest = walk()
            server.publish(manifest.to_json())
        out, chain = _start_chain(hosts, one, server.addr, me, root, simulate_hosts, store_dir, dest_root, run_id,
                                  timeout, transport)
        if manifest is None:
            try:
                manifest = lookup.manifest = walk()
            except BaseException as exc:  # the hosts waiting for the manifest stop now, not at their timeout
                server.fail(f"the controller's walk of {root} failed: {type(exc).__name__}: {exc}")
                _wait_chain(out, chain, one)
                raise
            server.publish(manifest.to_json())
        for hs in out:
            if hs.stats.transport == "same-host":
                hs.stats.files = len(manifest.entries)
        out = _wait_chain(out, chain, one)
    finally:
        server.close()
        lookup.held.clear()  # small files' bytes the walk kept to serve, once: not kept with the manifest below
    failed = [hs for hs in out if hs.stats.error]
    if failed:
        _record(out, run_id)  # the failed hosts' rows (with their errors) land in file_syncs too
        raise RuntimeError("workspace sync failed on " + "; ".join(f"host {hs.host}: {hs.stats.error}" for hs in failed)
                           + " (the other hosts completed; stored chunks are kept: call sync_workspace again to resume)")
    before = {rec.proc_id: rec.incarnation for rec in recs}  # a restart below is complete once this grew
    changed = _changed(state.last.get(root), manifest)
    state.last[root] = manifest
    for hs in out:
        same = hs.dest == root
        dirs = [root, *(os.path.join(root, r) for r in inside)] if same else \
            [hs.dest, *(os.path.join(hs.dest, r) for r in inside), *(os.path.join(hs.dest, er.prefix) for er in extras)]
        for rank in hosts[hs.host]:
            one(rank).activate.call_one(dirs, hs.dest, chdir).get()
            _remember(procs._controller, recs[rank].proc_id, dirs)
        if mode != ReloadMode.OFF and changed:
            files = [_source_of(p, hs.dest, root, extras) if same else os.path.join(hs.dest, *p.split("/"))
                     for p in changed]
            roots = dirs + ([er.root for er in extras] if same else [])
            hs.reloads = [_reload_one(procs, one(r), recs[r].proc_id, r, roots, files, mode) for r in hosts[hs.host]]
    restarted = [recs[r.rank] for hs in out for r in hs.reloads if r.restarted]
    _wait_replaced(restarted, before, timeout)
    _record(out, run_id)
    return out


@dataclasses.dataclass
class _Hop:
    """One receiving host in the chain: where it pulls from and where it serves."""

    host: str
    ranks: list[int]
    dest: str
    upstream: str
    addr: str


def _start_chain(hosts: dict[str, list[int]], one: Callable[[int], Any], source: str, me: str, root: str,
                 simulate_hosts: bool, store_dir: str, dest_root: str, run_id: str, timeout: float,
                 transport: ChunkTransport = ChunkTransport.AUTO) -> tuple[list[HostSync], list[_Hop]]:
    """Start every host's pull along the chain (source -> host0 -> host1 ...): the rows settled already
    (this host's, hosts whose proc died before starting) and the hops to wait for (:func:`_wait_chain`).

    A host whose proc dies before its pull is cut out of the chain: the host after it pulls from
    that host's upstream instead."""
    out: list[HostSync] = []
    chain: list[_Hop] = []
    up = source
    for i, (host, ranks) in enumerate(hosts.items()):
        if host == me and not simulate_hosts:
            out.append(HostSync(host, root, WorkspaceSyncStats(transport="same-host")))
            continue
        dest = os.path.join(dest_root, f"host-{i}" if simulate_hosts else "", run_id)
        store = os.path.join(store_dir, f"host-{i}") if simulate_hosts else store_dir
        try:
            addr = one(ranks[0]).start.call_one(up, store, dest, timeout, transport.value).get()
        except ActorError as exc:  # its proc died: the next host pulls from this one's upstream
            out.append(HostSync(host, dest, WorkspaceSyncStats(error=f"{type(exc).__name__}: {exc}")))
            continue
        chain.append(_Hop(host, ranks, dest, up, addr))
        up = addr
    return out, chain


def _wait_chain(out: list[HostSync], chain: list[_Hop], one: Callable[[int], Any]) -> list[HostSync]:
    """Wait for every hop of :func:`_start_chain`; ``out`` plus a row per hop.

    A host whose proc dies during its pull, or whose pull fails, is cut out of the chain: the host after
    it pulls from that host's upstream instead, keeping what it already stored, so the others complete;
    the failed host gets a row with its error."""
    out = list(out)
    for k, hop in enumerate(chain):
        try:
            st = one(hop.ranks[0]).wait.call_one().get()
        except ActorError as exc:
            st = dataclasses.asdict(WorkspaceSyncStats(error=f"{type(exc).__name__}: {exc}"))
        if st["error"] and k + 1 < len(chain):  # died, or its pull failed: it will not serve the rest
            nxt = chain[k + 1]
            nxt.upstream = hop.upstream
            logger.warning("workspace sync: host %s failed (%s); host %s now pulls from its upstream",
                           hop.host, st["error"], nxt.host)
            try:
                one(nxt.ranks[0]).relink.call_one(hop.upstream).get()
            except ActorError:
                pass  # that one died too: its own wait reports it, and relinks the next
        out.append(HostSync(hop.host, hop.dest, WorkspaceSyncStats(**st)))
    for hop in chain:
        try:
            one(hop.ranks[0]).finish.call_one().get()
        except ActorError:
            pass  # a dead host's agent: nothing to close
    return out


def _wait_replaced(recs: list[Any], before: dict[str, int], timeout: float) -> None:
    """Until each restarted proc's replacement is alive with its actors re-created (the next call runs new code)."""
    deadline = time.monotonic() + timeout
    while recs:
        recs = [r for r in recs if not (r.incarnation > before[r.proc_id] and r.state == ProcState.ALIVE)]
        if any(r.state in (ProcState.FAILED, ProcState.STOPPED) for r in recs):
            raise RuntimeError(f"procs restarted for new code will not come back: {[r.proc_id for r in recs]}")
        if recs and time.monotonic() > deadline:
            raise TimeoutError(f"procs restarted for new code not back after {timeout:.0f}s: {[r.proc_id for r in recs]}")
        time.sleep(0.02)


def _source_of(rel: str, dest: str, root: str, extras: list[EditableRoot]) -> str:
    """A manifest path's file on the controller's own host (an editable tree's lives in its project)."""
    for er in extras:
        if rel.startswith(er.prefix + "/"):
            return os.path.join(er.root, *rel[len(er.prefix) + 1:].split("/"))
    return os.path.join(root, *rel.split("/"))


def _remember(controller: Any, proc_id: str, dirs: list[str]) -> None:
    """A replacement of this proc imports the tree too: first on its ``PYTHONPATH``, and (forked from
    a warm template) with the template's copies of the tree's modules dropped."""
    def do() -> None:
        rec = controller.procs[proc_id]
        env = rec.env = dict(rec.env)  # its own: the procs of a mesh start out sharing one dict
        old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in dirs]
        env["PYTHONPATH"] = os.pathsep.join([*dirs, *old])
        fresh = [*dirs, *(p for p in env.get(FRESH_IMPORTS_ENV, "").split(os.pathsep) if p)]
        env[FRESH_IMPORTS_ENV] = os.pathsep.join(dict.fromkeys(fresh))

    controller.submit(do).result()


def _reload_one(procs: Any, agent: Any, proc_id: str, rank: int, roots: list[str], files: list[str],
                mode: ReloadMode) -> ProcReload:
    res: ProcReload = agent.reload.call_one(roots, files).get()
    res.rank = rank
    if res.unsafe and mode == ReloadMode.AUTO:
        res.restarted = procs._controller.restart_proc(proc_id, "workspace reload: " + ", ".join(res.unsafe))
        if not res.restarted:
            logger.warning("proc %s imported changed actor modules %s but could not be restarted (not alive, or its "
                           "mesh has no restart policy): it runs the old code", proc_id, res.unsafe)
    elif res.unsafe:
        logger.warning("proc %s runs old code of %s (actor classes are not reloaded in place; use reload='auto' "
                       "to restart it)", proc_id, res.unsafe)
    return res


def _record(rows: list[HostSync], sync_id: str) -> None:
    """One ``file_syncs`` row per host, when telemetry is running in this process."""
    for hs in rows:
        s = hs.stats
        try:
            telemetry.record("file_syncs", sync_id=sync_id, target_host=hs.host, dest=hs.dest, files=s.files,
                             files_sent=s.files_written, files_skipped=s.files_skipped, bytes_total=s.bytes_total,
                             bytes_sent=s.bytes_received, chunks_sent=s.chunks_received,
                             chunks_deduplicated=s.chunks_deduplicated, transport=s.transport, relinks=s.relinks,
                             duration_s=s.duration_s, error=s.error)
        except Exception:
            logger.debug("file_syncs row not recorded", exc_info=True)
