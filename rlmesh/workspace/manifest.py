"""A content-addressed description of a directory tree: what to send, and what a receiver may accept.

Why a manifest: a receiver compares chunk hashes with what its store holds and asks
only for the rest, so a re-sync after a one-line edit moves one file's chunks. The
same path checks run when the manifest is built (sending side) and when it is read
(:meth:`TreeManifest.from_json`, receiving side): a manifest from a buggy or hostile
peer cannot write outside the destination.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import stat
from dataclasses import dataclass, field
from enum import StrEnum

CHUNK_BYTES = 4 << 20
DEFAULT_EXCLUDES: tuple[str, ...] = (".git", ".venv*", "runs/", "__pycache__")


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


@dataclass
class TreeManifest:
    entries: list[Entry] = field(default_factory=list)
    chunk_bytes: int = CHUNK_BYTES

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
        rows = [{"path": e.path, "kind": str(e.kind), "mode": e.mode, "size": e.size, "chunks": list(e.chunks),
                 "target": e.target} for e in self.entries]  # not asdict(): it deep-copies, 5x slower at 10,000 files
        return json.dumps({"chunk_bytes": self.chunk_bytes, "entries": rows}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "TreeManifest":
        """Parse and re-check every path (the receiving side's refusal of escaping paths)."""
        raw = json.loads(data)
        entries = []
        for d in raw["entries"]:
            e = Entry(d["path"], Kind(d["kind"]), int(d["mode"]), int(d["size"]), tuple(d["chunks"]), d["target"])
            check_relpath(e.path)
            if e.kind == Kind.SYMLINK:
                check_link(e.path, e.target)
            entries.append(e)
        check_links(entries)
        return cls(entries, int(raw["chunk_bytes"]))


def check_relpath(path: str) -> str:
    """``path`` if it is a relative POSIX path that stays inside the root, else :class:`UnsafePathError`."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise UnsafePathError(f"workspace path {path!r} is absolute or malformed; only paths inside the root sync")
    if any(p in ("..", "") for p in path.split("/")) or posixpath.normpath(path) != path:
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


def _excluded(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    for pat in patterns:
        dir_only = pat.endswith("/")
        p = pat.rstrip("/")
        if dir_only and not is_dir:
            continue
        if "/" in p.lstrip("/"):
            if fnmatch.fnmatchcase(rel, p.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, p):
            return True
    return False


def hash_chunks(fp: str, chunk_bytes: int) -> tuple[int, tuple[str, ...]]:
    """``(size, chunk hashes)`` of a file (BLAKE2b-256 per chunk)."""
    hashes, size = [], 0
    with open(fp, "rb") as f:
        while block := f.read(chunk_bytes):
            size += len(block)
            hashes.append(hashlib.blake2b(block, digest_size=32).hexdigest())
    return size, tuple(hashes)


_cache: dict[str, tuple[tuple[int, int, int, int], tuple[int, tuple[str, ...]]]] = {}


def build_manifest(root: str, exclude: tuple[str, ...] | list[str] = (), defaults: bool = True,
                   chunk_bytes: int = CHUNK_BYTES) -> TreeManifest:
    """Walk ``root`` (exclusions: ``DEFAULT_EXCLUDES``, ``exclude`` and the root ``.gitignore``).

    Files whose (size, mtime, inode) did not change since the last walk in this
    process are not re-hashed, so a re-sync of a large tree costs a ``stat`` per file.
    Refuses (:class:`UnsafePathError`) a symlink out of the root, a device, FIFO or socket.
    """
    root = os.path.abspath(root)
    real_root = os.path.realpath(root)
    patterns = [*(DEFAULT_EXCLUDES if defaults else ()), *exclude, *_gitignore_patterns(root)]
    entries: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        reldir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        reldir = "" if reldir == "." else reldir
        keep = []
        for d in sorted(dirnames):
            rel = f"{reldir}/{d}" if reldir else d
            full = os.path.join(dirpath, d)
            if _excluded(rel, True, patterns):
                continue
            if os.path.islink(full):
                filenames.append(d)  # a symlink to a directory is recorded as a link, never followed
                continue
            keep.append(d)
            entries.append(Entry(rel, Kind.DIR, stat.S_IMODE(os.lstat(full).st_mode)))
        dirnames[:] = keep
        for fname in sorted(filenames):
            rel = f"{reldir}/{fname}" if reldir else fname
            if _excluded(rel, False, patterns):
                continue
            full = os.path.join(dirpath, fname)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(full)
                check_link(rel, target)
                if not _inside(os.path.realpath(full), real_root):
                    raise UnsafePathError(f"symlink {rel!r} -> {target!r} resolves outside the workspace root on disk "
                                          f"({os.path.realpath(full)}); exclude it or make it point inside")
                entries.append(Entry(rel, Kind.SYMLINK, 0o777, target=target))
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_size, st.st_mtime_ns, st.st_ino, chunk_bytes)
                hit = _cache.get(full)
                if hit is None or hit[0] != key:
                    hit = _cache[full] = (key, hash_chunks(full, chunk_bytes))
                size, chunks = hit[1]
                entries.append(Entry(rel, Kind.FILE, stat.S_IMODE(st.st_mode), size, chunks))
            else:
                raise UnsafePathError(f"{full} is a device, FIFO or socket: it cannot be synced; exclude it")
    for e in entries:
        check_relpath(e.path)
    check_links(entries)
    return TreeManifest(entries, chunk_bytes)


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
    return TreeManifest(entries, main.chunk_bytes)
