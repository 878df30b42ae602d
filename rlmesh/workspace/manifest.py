"""A content-addressed description of a directory tree: what to send, and what a receiver may accept.

Why a manifest: a receiver compares chunk hashes with what its store holds and asks
only for the rest, so a re-sync after a one-line edit moves one file's chunks. The
same path checks run when the manifest is built (sending side) and when it is read
(:meth:`TreeManifest.from_json`, receiving side): a manifest from a buggy or hostile
peer cannot write outside the destination.
"""

from __future__ import annotations

import fnmatch
import gc
import json
import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from json.encoder import encode_basestring_ascii as _quote
from enum import StrEnum

from blake3 import blake3

CHUNK_BYTES = 4 << 20
DEFAULT_EXCLUDES: tuple[str, ...] = (".git", ".venv*", "runs/", "__pycache__")


HASH = "blake3"
"""The content hash of chunks, file objects and manifests (BLAKE3-256, hex), named in every manifest.

Why BLAKE3: it stays a cryptographic content address (a hostile peer cannot make bytes that match a
chunk's hash), and it hashes ~5x as fast as BLAKE2b on one core (5.3 against 0.96 GB/s here): every
byte is hashed by the source's first walk and again by every receiving host. A manifest naming another
hash (a peer on an older rlmesh) is refused, and a store keeps its chunks under a folder named for
the hash (:data:`rlmesh.workspace.store.LAYOUT`), so a chunk stored under the old one is never read
as a new one."""


def content_hash(data: bytes | memoryview) -> str:
    """The hex BLAKE3-256 of ``data`` (:data:`HASH`)."""
    return blake3(data).hexdigest()


class HashMismatchError(ValueError):
    """A manifest from a peer that hashes content another way (another rlmesh version): nothing of it is used."""


class UnsafePathError(ValueError):
    """A path would escape the workspace root (``..``, absolute, a symlink out, a device or FIFO)."""


class Kind(StrEnum):
    FILE = "file"
    SYMLINK = "symlink"
    DIR = "dir"


@dataclass(frozen=True)
class Entry:
    path: str  # POSIX, relative to the root
    kind: Kind
    mode: int = 0o644
    size: int = 0
    chunks: tuple[str, ...] = ()  # hex hashes, in file order
    target: str = ""  # symlink target (relative, inside the root)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a block makes a manifest's worth of objects.

    Why: 10,000 rows are ~60,000 container objects; making them triggers full collections, each a
    walk over every live object, and a parse of 10,000 rows took 1-3x as long with collection on.
    Reference counting still frees everything. Collection resumes at the end if it was on when the
    block began (with threads interleaving such blocks, it ends on whenever one of them found it on)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


Row = list  # an entry on the wire: ``[path, kind, mode, size, [chunk, ...], target]`` (JSON array)


def entry_row(e: Entry) -> list:
    """``e`` as its wire row: what :meth:`TreeManifest.to_json` writes and a receiver compares."""
    return [e.path, e.kind.value, e.mode, e.size, list(e.chunks), e.target]


def _encoded(e: Entry) -> str:
    """``json.dumps(entry_row(e), separators=(",", ":"))``, the same bytes at a third of the cost (a
    first walk encodes every row: ~3 us a row through ``dumps``), strings quoted by json's own C quoter."""
    chunks = ",".join(map(_quote, e.chunks))
    return f"[{_quote(e.path)},\"{e.kind.value}\",{int(e.mode)},{int(e.size)},[{chunks}],{_quote(e.target)}]"


_KINDS = {k.value: k for k in Kind}


@dataclass
class TreeManifest:
    entries: list[Entry] = field(default_factory=list)
    chunk_bytes: int = CHUNK_BYTES
    encoded: list[str] | None = field(default=None, compare=False, repr=False)
    """Each entry's wire row as JSON text, in order (:func:`build_manifest` keeps it per unchanged file):
    :meth:`to_json` joins them instead of encoding 10,000 rows again on every re-sync."""
    same: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """Paths whose row equals the one this host accepted before (:meth:`from_json`'s ``known``)."""
    held: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    """Chunk hash -> its bytes, for small files hashed in the walk that made this manifest (up to
    :data:`HELD_BYTES` in all): the source serves them from here (:func:`~rlmesh.workspace.serve.source_lookup`
    takes each out as it sends it) instead of opening and reading each file a second time. They are
    the very bytes that were hashed, so a file edited since the walk cannot be sent under an old hash."""

    def chunk_sizes(self) -> dict[str, int]:
        """Every distinct chunk hash -> its size in bytes."""
        out: dict[str, int] = {}
        for e in self.entries:
            left = e.size
            for h in e.chunks:
                out[h] = min(left, self.chunk_bytes)
                left -= self.chunk_bytes
        return out

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == Kind.FILE)

    def to_json(self) -> bytes:
        """Rows as arrays, not objects: a third of the bytes, and at 10,000 files encoding and parsing
        are a re-sync's main cost after the walk."""
        if self.encoded is not None and len(self.encoded) == len(self.entries):
            return f'{{"hash":"{HASH}","chunk_bytes":{int(self.chunk_bytes)},"rows":[{",".join(self.encoded)}]}}'.encode()
        with gc_paused():
            rows = [[e.path, e.kind.value, e.mode, e.size, e.chunks, e.target] for e in self.entries]
            return json.dumps({"hash": HASH, "chunk_bytes": self.chunk_bytes, "rows": rows},
                              separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, known: dict[str, Row] | None = None) -> "TreeManifest":
        """Parse and re-check every path (the receiving side's refusal of escaping paths).

        ``known``: rows this host accepted before (:func:`read_rows` of its own state file); a row
        equal to one of them is not checked again (its path passed when it was first written), so a
        re-sync of 10,000 unchanged files checks only what changed. Links are always checked
        against each other (one changed link can make an unchanged one lead out)."""
        known = known or {}
        entries = []
        same = set()
        with gc_paused():
            raw = json.loads(data)
            if raw.get("hash") != HASH:
                raise HashMismatchError(f"the manifest's chunks are hashed with {raw.get('hash', 'blake2b')!r}, this host "
                                        f"checks {HASH!r}: the sending side runs another rlmesh version; install the "
                                        "same rlmesh on every host")
            for row in _rows_of(raw):
                path, kind, mode, size, chunks, target = row
                e = Entry(path, _KINDS[kind], int(mode), int(size), tuple(chunks), target)
                if known.get(path) != row:
                    check_relpath(e.path)
                else:
                    same.add(path)
                entries.append(e)
        check_links([e for e in entries if e.kind == Kind.SYMLINK])
        return cls(entries, int(raw["chunk_bytes"]), same=frozenset(same))


def _rows_of(raw: dict) -> list[Row]:
    """The wire rows of a parsed manifest; a state file written before rows were arrays has objects."""
    if "rows" in raw:
        rows = raw["rows"]
        if not all(isinstance(r, list) and len(r) == 6 for r in rows):
            raise ValueError("a manifest row is not [path, kind, mode, size, chunks, target]")
        return rows
    return [[d["path"], d["kind"], d["mode"], d["size"], d["chunks"], d["target"]] for d in raw["entries"]]


def read_rows(data: bytes) -> dict[str, Row]:
    """``path -> row`` of a manifest this host wrote itself (no checks: it passed them when written).
    One written under an older hash needs no check either: its rows' chunk hashes equal none of
    this version's, so each of its files is written again (an empty file, the same under any hash, is kept)."""
    with gc_paused():
        return {r[0]: r for r in _rows_of(json.loads(data))}


def check_relpath(path: str) -> str:
    """``path`` if it is a relative POSIX path that stays inside the root, else :class:`UnsafePathError`."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise UnsafePathError(f"workspace path {path!r} is absolute or malformed; only paths inside the root sync")
    parts = path.split("/")  # what normpath would change: '', '.' or '..' as a component (three C scans)
    if "" in parts or ".." in parts or "." in parts:
        raise UnsafePathError(f"workspace path {path!r} escapes the root ('..' or not normalised)")
    return path


def check_link(path: str, target: str) -> None:
    """A symlink may only point inside the root, by a relative target."""
    if target.startswith("/"):
        raise UnsafePathError(f"symlink {path!r} -> {target!r} is absolute; make it relative or exclude it")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafePathError(f"symlink {path!r} -> {target!r} points outside the workspace root; exclude it")


MAX_LINK_HOPS = 64
"""Links followed in resolving one link: more than the kernel's 40 (``ELOOP``), so a link this
gives up on cannot be resolved on disk either."""


class _Unresolvable(Exception):
    """Too many links (a loop): the kernel refuses to follow it too, so it leads nowhere."""


def check_links(entries: list[Entry]) -> None:
    """Each symlink of ``entries``, resolved through the other links of the same tree as the kernel
    would (``a/..`` is the parent of where ``a`` *leads*, not of ``a``), must stay inside the root.

    Why: :func:`check_link` looks at one target on paper. ``d/up -> ..`` (the root) and
    ``esc -> d/up/..`` (``d`` on paper) each pass it, and on disk ``esc`` is the root's parent.
    A loop (more than :data:`MAX_LINK_HOPS` links) resolves nowhere and is let through."""
    links = {e.path: e.target for e in entries if e.kind == Kind.SYMLINK}
    for path, target in links.items():
        check_link(path, target)
        via: list[str] = []
        try:
            _walk(links, _walk(links, [], posixpath.dirname(path), via), target, via)
        except _Unresolvable:
            continue
        except UnsafePathError:
            through = f" (through {', '.join(via)})" if via else ""
            raise UnsafePathError(f"symlink {path!r} -> {target!r} leads outside the workspace root on disk{through}; "
                                  "exclude it or make it point inside") from None


def _walk(links: dict[str, str], where: list[str], rel: str, via: list[str]) -> list[str]:
    """``where`` (resolved components under the root) joined with ``rel``, following ``links``
    (each one followed is appended to ``via``); :class:`UnsafePathError` above the root."""
    where = list(where)
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                raise UnsafePathError("above the root")
            where.pop()
            continue
        where.append(part)
        at = "/".join(where)
        target = links.get(at)
        if target is not None:
            via.append(f"{at!r} -> {target!r}")
            if len(via) > MAX_LINK_HOPS:
                raise _Unresolvable
            if target.startswith("/"):
                raise UnsafePathError("absolute")
            where = _walk(links, where[:-1], target, via)
    return where


def _gitignore_patterns(root: str) -> list[str]:
    """Patterns of the root's ``.gitignore`` (a subset: no negation, no nested files)."""
    try:
        lines = open(os.path.join(root, ".gitignore")).read().splitlines()
    except OSError:
        return []
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("#", "!"))]


class _Excluder:
    """The exclusion patterns as four compiled alternations (name or path; any entry or folders only).

    Why: a first walk asks about every file, and ``fnmatch`` pattern by pattern cost ~5-8 us a file;
    one ``match`` per kind says the same (each alternative is ``fnmatch.translate`` of one pattern).
    A pattern with a ``/`` inside matches the path from the root; one without, the name; a trailing
    ``/`` limits it to folders."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        groups: dict[tuple[bool, bool], list[str]] = {(p, d): [] for p in (False, True) for d in (False, True)}
        for pat in patterns:
            dir_only = pat.endswith("/")
            p = pat.rstrip("/")
            by_path = "/" in p.lstrip("/")
            groups[(by_path, dir_only)].append(fnmatch.translate(p.lstrip("/") if by_path else p))
        self._match = {k: re.compile("|".join(v)).match if v else None for k, v in groups.items()}

    def __call__(self, rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        for (by_path, dir_only), match in self._match.items():
            if match is not None and (is_dir or not dir_only) and match(rel if by_path else name):
                return True
        return False


def pread_full(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes of ``fd`` from ``offset``, or fewer only at the end of the file: a short read (a network
    file system) is followed by reads of the rest. One ``pread`` on a bare descriptor, no file object."""
    data = os.pread(fd, n, offset)
    while len(data) < n:
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


HELD_BYTES = 64 << 20
"""Bytes of small files a walk keeps for the source to serve (:attr:`TreeManifest.held`)."""
_HINT_BATCH = 256  # small files' hints gathered before they go to the server (:func:`build_manifest`'s ``on_hint``)
HELD_CHUNK = 64 << 10
"""Files up to this size are kept (a 10,000-file tree of source code: a few MiB)."""


def hash_chunks(fp: str, chunk_bytes: int, held: dict[str, bytes] | None = None,
                size_hint: int = -1) -> tuple[int, tuple[str, ...]]:
    """``(size, chunk hashes)`` of a file (:func:`content_hash` per chunk). Read with :func:`pread_full` on a bare
    descriptor: a first walk of 10,000 small files spent ~40 % of its time per file making and closing
    a buffered file object (15 us a file against 8-9 us).

    ``size_hint`` (its ``stat`` size): a small file is read with one buffer of its size, not a chunk's
    4 MiB (one that grew since is read the general way). ``held``: such a file of up to
    :data:`HELD_CHUNK` bytes is kept there by hash (:attr:`TreeManifest.held`)."""
    fd = os.open(fp, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if 0 <= size_hint < min(chunk_bytes, HELD_CHUNK):
            block = os.pread(fd, size_hint + 1, 0)  # its stat size read whole is the file as its stat saw it
            if len(block) < size_hint:  # short (a network file system) or shrunk: read to the end
                block += pread_full(fd, size_hint + 1 - len(block), len(block))
            if not block:
                return 0, ()
            if len(block) <= size_hint:  # the whole file: it did not grow since its stat
                h = content_hash(block)
                if held is not None:
                    held[h] = block
                return len(block), (h,)
        hashes, size = [], 0
        while block := pread_full(fd, chunk_bytes, size):  # a chunk is whole, or the end of the file
            size += len(block)
            hashes.append(content_hash(block))  # one thread: blake3.AUTO's was no faster on 2 loaded cores
            if len(block) < chunk_bytes:
                break
    finally:
        os.close(fd)
    return size, tuple(hashes)


_FileKey = tuple[int, int, int, int, int, str]  # size, mtime_ns, inode, st_mode, chunk_bytes, path in the tree
_cache: dict[str, tuple[_FileKey, Entry, str]] = {}  # path -> (its stat key, its entry, the entry's wire row)
_excluded_cache: dict[tuple[str, ...], tuple[_Excluder, dict[tuple[str, bool], bool]]] = {}


def forget_walks() -> None:
    """Drop what earlier walks in this process learnt: the next :func:`build_manifest` hashes every file
    again, as a new process's first walk does (benchmarks time that first sync)."""
    _cache.clear()


def build_manifest(root: str, exclude: tuple[str, ...] | list[str] = (), defaults: bool = True,
                   chunk_bytes: int = CHUNK_BYTES, held: dict[str, bytes] | None = None,
                   on_hint: Callable[[list[list[Any]]], None] | None = None) -> TreeManifest:
    """Walk ``root`` (exclusions: ``DEFAULT_EXCLUDES``, ``exclude`` and the root ``.gitignore``).

    ``held``: where the small files' bytes go (:attr:`TreeManifest.held`; a new dict when None).
    ``on_hint``: called after each folder with ``[hash, size, mode]`` of the small files just kept
    (:meth:`~rlmesh.workspace.serve.ChunkServer.hint`), so they can travel while the walk goes on.

    Files whose (size, mtime_ns, inode, mode) did not change since the last walk in this process
    keep their entry: not re-hashed, not re-checked, so a re-sync of a 10,000-file tree costs one
    ``lstat`` per file (from ``scandir``) and a dictionary lookup. What that cannot see: a file
    rewritten to the same size within the file system's timestamp granularity, or with its
    mtime set back, keeps its old hashes (as ``rsync``'s default quick check would); touch it
    or start a new controller process to re-hash it.
    Refuses (:class:`UnsafePathError`) a symlink out of the root, a device, FIFO or socket.
    """
    root = os.path.abspath(root)
    real_root = os.path.realpath(root)
    patterns = (*(DEFAULT_EXCLUDES if defaults else ()), *exclude, *_gitignore_patterns(root))
    if patterns not in _excluded_cache:
        _excluded_cache[patterns] = (_Excluder(patterns), {})
    excluder, excluded = _excluded_cache[patterns]
    entries: list[Entry] = []
    encoded: list[str] = []
    links: list[Entry] = []
    held = {} if held is None else held
    room = [HELD_BYTES]  # what ``held`` may still take

    def skip(rel: str, is_dir: bool) -> bool:
        hit = excluded.get((rel, is_dir))
        if hit is None:
            hit = excluded[(rel, is_dir)] = excluder(rel, is_dir)
        return hit

    def walk(folder: str, reldir: str) -> None:
        with os.scandir(folder) as it:
            found = sorted(it, key=lambda d: d.name)
        subdirs = []
        for d in found:  # folders first (each before what is inside it), then the files, by name
            if d.is_dir(follow_symlinks=False):
                rel = f"{reldir}/{d.name}" if reldir else d.name
                if not skip(rel, True):
                    subdirs.append((d.path, rel))
                    entries.append(Entry(check_relpath(rel), Kind.DIR, stat.S_IMODE(d.stat(follow_symlinks=False).st_mode)))
                    encoded.append(_encoded(entries[-1]))
        hints: list[list[Any]] = []
        for d in found:
            if d.is_dir(follow_symlinks=False):
                continue
            rel = f"{reldir}/{d.name}" if reldir else d.name
            if skip(rel, d.is_symlink() and d.is_dir()):  # a link to a folder is matched as a folder, never followed
                continue
            st = d.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                key = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, chunk_bytes, rel)
                hit = _cache.get(d.path)
                if hit is None or hit[0] != key:
                    n = len(held)
                    size, chunks = hash_chunks(d.path, chunk_bytes, held if room[0] > 0 else None, st.st_size)
                    if len(held) > n:
                        room[0] -= size
                        hints.append([chunks[0], size, stat.S_IMODE(st.st_mode)])
                    e = Entry(check_relpath(rel), Kind.FILE, stat.S_IMODE(st.st_mode), size, chunks)
                    hit = _cache[d.path] = (key, e, _encoded(e))
                entries.append(hit[1])
                encoded.append(hit[2])
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(d.path)
                check_link(check_relpath(rel), target)
                if not _inside(os.path.realpath(d.path), real_root):
                    raise UnsafePathError(f"symlink {rel!r} -> {target!r} resolves outside the workspace root on disk "
                                          f"({os.path.realpath(d.path)}); exclude it or make it point inside")
                links.append(Entry(rel, Kind.SYMLINK, 0o777, target=target))
                entries.append(links[-1])
                encoded.append(_encoded(links[-1]))
            else:
                raise UnsafePathError(f"{d.path} is a device, FIFO or socket: it cannot be synced; exclude it")
        if hints and on_hint is not None:
            pending_hints.extend(hints)
            if len(pending_hints) >= _HINT_BATCH:  # a few folders a message: each one wakes the server thread
                on_hint(pending_hints[:])
                pending_hints.clear()
        for path, rel in subdirs:
            walk(path, rel)

    pending_hints: list[list[Any]] = []
    with gc_paused():
        walk(root, "")
    if pending_hints and on_hint is not None:
        on_hint(pending_hints)
    check_links(links)
    return TreeManifest(entries, chunk_bytes, encoded, held=held)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def with_extras(main: TreeManifest, extras: list[tuple[str, TreeManifest]]) -> TreeManifest:
    """``main`` plus each extra tree under its prefix (``.rlmesh-editable/<dist>``), one manifest.

    The prefix's folders become directory entries, so a receiver creates them like any other."""
    entries = list(main.entries)
    made = {e.path for e in main.entries if e.kind == Kind.DIR}
    for prefix, m in extras:
        if m.chunk_bytes != main.chunk_bytes:
            raise ValueError("extra trees must be chunked like the main tree")
        parts = check_relpath(prefix).split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in made:
                made.add(d)
                entries.append(Entry(d, Kind.DIR, 0o755))
        entries += [Entry(f"{prefix}/{e.path}", e.kind, e.mode, e.size, e.chunks, e.target) for e in m.entries]
    held = main.held  # the same dict (a source's lookup holds it): cleared with it after the sync
    for _, m in extras:
        if m.held is not held:
            held.update(m.held)
    return TreeManifest(entries, main.chunk_bytes, held=held)
