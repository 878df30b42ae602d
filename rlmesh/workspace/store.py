"""A per-host chunk store and the materialisation of a manifest from it.

Why a store: a chunk already on the host (an earlier sync, another run) is never
sent again; receivers ask only for :meth:`ChunkStore.missing`. Every chunk is
verified by hash before it is stored (:meth:`ChunkStore.put`), and a file appears in
the destination only complete: written under a temporary name, checked, renamed.
A one-chunk file is a hard link to the store's chunk (no copy) when the store and
the destination share a filesystem.

A file of several chunks is written once too: its chunks are written as they arrive
into a *file object* (``files/<id>``, named by the file's chunk list), each chunk then
known to the store by a reference (``<hash>.ref``: object, offset, size) instead of a
copy, and the finished object becomes the destination file by a hard link. Before,
each chunk was stored and then copied into the destination: a 1 GiB file cost 2 GiB of
writes on every host, and on hosts that share a disk that was the bottleneck.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from rlmesh.workspace.manifest import (HASH, Entry, Kind, Row, TreeManifest, UnsafePathError, check_link,
                                       check_relpath, content_hash, entry_row, read_rows)

LAYOUT = f"{HASH}-v1"
"""The folder under a store's root that holds its chunks, named for the hash and the layout: a store
left by an rlmesh that hashed with BLAKE2b kept its chunks in the root itself, and they are never
read as BLAKE3 ones (that older layout's ``??/`` and ``files/`` folders may be deleted)."""
DEFAULT_STORE = os.path.join(os.path.expanduser("~"), ".cache", "rlmesh", "chunks")
STATE_FILE = ".rlmesh-manifest.json"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX64_LINES = re.compile(r"(?:[0-9a-f]{64}\n)*")
_LIST_AT = 8  # hashes asked about in one fan-out folder from which listing it beats a stat per hash


class CorruptChunkError(ValueError):
    """Bytes whose hash is not the one they were sent as: rejected, never stored."""


chunk_hash = content_hash


class ChunkStore:
    """Chunks by hash under ``base/LAYOUT/ab/abcdef...`` (written to a temp name, then renamed)."""

    def __init__(self, base: str = DEFAULT_STORE):
        self.base = base
        self.root = os.path.join(base, LAYOUT)
        os.makedirs(self.root, exist_ok=True)
        self._dirs: set[str] = set()  # fan-out folders known to exist (one makedirs each, not one per chunk)

    def _folder_of(self, path: str) -> str:
        return self._folder(os.path.dirname(path))

    def _folder(self, d: str) -> str:
        """Folder ``d``, made on first use (a tree of small files puts a chunk per file: one makedirs per folder)."""
        if d not in self._dirs:
            os.makedirs(d, exist_ok=True)
            self._dirs.add(d)
        return d

    def path(self, h: str) -> str:
        if not _HEX64.fullmatch(h):
            raise CorruptChunkError(f"{h!r} is not a chunk hash")
        return self._path(h)

    def _path(self, h: str) -> str:
        """:meth:`path` of a hash known to be well formed (our own digest)."""
        return f"{self.root}{os.sep}{h[:2]}{os.sep}{h}"  # not os.path.join: called ~5 times per chunk

    def ref_path(self, h: str) -> str:
        return self.path(h) + ".ref"

    def object_path(self, oid: str) -> str:
        if not _HEX64.fullmatch(oid):
            raise CorruptChunkError(f"{oid!r} is not a file object id")
        return os.path.join(self.root, "files", oid)

    def has(self, h: str) -> bool:
        return os.path.exists(self.path(h)) or os.path.exists(self.ref_path(h))

    def missing(self, hashes: list[str] | set[str], listed: dict[str, set[str]] | None = None) -> list[str]:
        """The hashes of ``hashes`` this store holds neither as a chunk nor as a reference.

        A fan-out folder asked about for many hashes at once is listed once instead of two
        ``stat`` calls per hash: a re-sync of a 10,000-file tree asks about 10,000 chunks it holds.
        ``listed``: listings kept by a caller that asks in many small batches (a receiver's hints,
        ~100 at a time) and knows what it stored since: every folder is listed once, on first use."""
        wanted = list(dict.fromkeys(hashes))
        if not _HEX64_LINES.fullmatch("".join(f"{h}\n" for h in wanted)):  # one scan: no folder named by a bad one is listed
            raise CorruptChunkError(f"{next(h for h in wanted if not _HEX64.fullmatch(h))!r} is not a chunk hash")
        per_dir = Counter(h[:2] for h in wanted)
        keep = listed is not None
        listed = {} if listed is None else listed
        for d, n in per_dir.items():
            if d in listed:
                continue
            if keep or n >= _LIST_AT:
                try:
                    listed[d] = set(os.listdir(os.path.join(self.root, d)))
                except OSError:
                    listed[d] = set()
        out = []
        for h in wanted:
            names = listed.get(h[:2])
            if names is None:
                if not self.has(h):
                    out.append(h)
            elif h not in names and h + ".ref" not in names:
                out.append(h)
        return out

    def put(self, h: str, data: bytes | memoryview, mode: int = 0o444) -> None:
        """Verify and store; :class:`CorruptChunkError` if ``data`` does not hash to ``h``.

        ``mode``: read-only unless the chunk is written for one file that will take its inode
        (:func:`materialise`'s ``stored_modes``): it is made with that file's mode, so the file
        needs no ``chmod`` later. Either way nobody edits a chunk in place."""
        _check(h, data)  # ``h`` is now our own hex digest: its path needs no pattern check
        d = self._folder(f"{self.root}{os.sep}{h[:2]}")
        _write_new(f"{d}{os.sep}{h}", data, mode)

    def put_in_object(self, h: str, data: bytes | memoryview, oid: str, offset: int, size: int) -> None:
        """Verify ``data`` and write it at ``offset`` of file object ``oid`` (a file of ``size``
        bytes, made on first use), then record where chunk ``h`` lives: its one write on this host."""
        _check(h, data)
        obj = self.object_path(oid)
        self._folder_of(obj)
        fd = os.open(obj, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            _pwrite_all(fd, data, offset)
        finally:
            os.close(fd)
        ref = self.ref_path(h)
        self._folder_of(ref)
        _write_ref(ref, oid, offset, len(data))

    def _ref(self, h: str) -> tuple[str, int, int] | None:
        """``(object path, offset, size)`` of a chunk kept inside a file object, else None."""
        try:
            with open(self.ref_path(h)) as f:
                oid, off, n = f.read().split()
            return self.object_path(oid), int(off), int(n)
        except (OSError, ValueError):
            return None

    def read(self, h: str) -> bytes:
        try:
            with open(self.path(h), "rb") as f:
                return f.read()
        except FileNotFoundError:
            ref = self._ref(h)
            if ref is None:
                raise
        with open(ref[0], "rb") as f:
            return os.pread(f.fileno(), ref[2], ref[1])

    def read_verified(self, h: str) -> bytes:
        """The chunk, re-hashed; a chunk whose bytes changed on disk is removed (so the next sync fetches
        it again) and :class:`CorruptChunkError` raised."""
        data = self.read(h)
        if chunk_hash(data) != h:
            self.drop(h)
            raise CorruptChunkError(f"store chunk {h[:12]}... is corrupt on disk (removed: sync again to fetch it)")
        return data

    def drop(self, h: str) -> None:
        for p in (self.path(h), self.ref_path(h)):
            try:
                os.unlink(p)
            except OSError:
                pass


def _check(h: str, data: bytes | memoryview) -> None:
    got = chunk_hash(data)
    if got != h:
        raise CorruptChunkError(f"chunk {h[:12]}... arrived with hash {got[:12]}...: rejected")


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    n = os.pwrite(fd, data, offset)  # almost always all of it: one call, no view
    if n == len(data):
        return
    view = memoryview(data)[n:]
    offset += n
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


_TMP_IDS = itertools.count()


def _write_new(path: str, data: bytes | memoryview, mode: int) -> None:
    """``path`` appears complete or not at all: written under a temporary name in its folder (made
    with ``mode``), then renamed. Why not ``tempfile.mkstemp``: a tree of 10,000 small files
    stores 10,000 chunks, and mkstemp's random names, ``fdopen`` and a separate ``chmod`` were
    about half of a receiver's time per chunk. The name (pid, counter) is unique among live
    writers; one left by a killed writer whose pid came back is replaced."""
    tmp = f"{path}.part-{os.getpid()}-{next(_TMP_IDS)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, flags, mode)
    try:
        _pwrite_all(fd, data, 0)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _write_ref(path: str, oid: str, offset: int, size: int) -> None:
    _write_new(path, f"{oid} {offset} {size}".encode(), 0o644)


def object_id(e: Entry) -> str:
    """The file object a multi-chunk entry is assembled in: named by its size and chunk list, so
    the same content synced again finds the same object."""
    return content_hash(f"{e.size}:{','.join(e.chunks)}".encode())


def placement(manifest: TreeManifest, wanted: Iterable[str]) -> dict[str, tuple[str, int, int]]:
    """Where each of ``wanted`` (chunks to fetch) is written on arrival: ``hash -> (object id,
    offset, object size)`` for a chunk of a multi-chunk file (its first such place); chunks of
    one-chunk files only are absent (they are stored as chunk files, see :meth:`ChunkStore.put`)."""
    want = set(wanted)
    out: dict[str, tuple[str, int, int]] = {}
    for e in manifest.entries if want else ():  # a re-sync that fetches nothing walks no entries
        if e.kind != Kind.FILE or len(e.chunks) < 2:
            continue
        oid = object_id(e)
        for i, h in enumerate(e.chunks):
            if h in want and h not in out:
                out[h] = (oid, i * manifest.chunk_bytes, e.size)
    return out


def solo_modes(manifest: TreeManifest, placed: dict[str, tuple[str, int, int]],
               wanted: set[str] | None = None) -> dict[str, int]:
    """``hash -> mode`` for chunks that are the whole of a one-chunk file (the first such file in
    the manifest) and of no multi-chunk file (``placed``): stored with that file's mode, the file can
    take the chunk's inode as it is (:func:`materialise`). ``wanted``: only these chunks (those
    fetched in this sync), else all."""
    out: dict[str, int] = {}
    for e in manifest.entries if wanted is None or wanted else ():
        if (e.kind == Kind.FILE and len(e.chunks) == 1 and e.chunks[0] not in placed
                and (wanted is None or e.chunks[0] in wanted)):
            out.setdefault(e.chunks[0], e.mode)
    return out


@dataclass
class MaterialiseResult:
    files_written: int = 0
    files_unchanged: int = 0
    files_removed: int = 0
    linked: int = 0


class _Targets:
    """Destination paths for manifest entries, each checked not to land outside ``dest`` through a
    symlinked directory. The real path of each parent folder is resolved once per materialisation
    (a tree of 10,000 files in 100 folders: 100 resolutions, not 10,000 of a dozen ``lstat`` each),
    and forgotten whenever a symlink is written, since a link can change where a folder leads."""

    def __init__(self, dest: str):
        self.dest = dest
        self.root = os.path.realpath(dest)
        self._parents: dict[str, str] = {}
        self._prefix = os.path.join(dest, "") if os.sep == "/" else ""  # tree paths are POSIX: joined by concatenation

    def __call__(self, rel: str) -> str:
        check_relpath(rel)
        if self._prefix:  # not os.path.join and dirname: ~2 us of a receiver's ~20 per small file
            full = self._prefix + rel
            d = full[:full.rfind("/")]
        else:
            full = os.path.join(self.dest, *rel.split("/"))
            d = os.path.dirname(full)
        parent = self._parents.get(d)
        if parent is None:
            parent = self._parents[d] = os.path.realpath(d)
        if parent != self.root and not parent.startswith(self.root + os.sep):
            raise UnsafePathError(f"{rel!r} would land outside {self.dest} through a symlinked directory")
        return full

    def forget(self) -> None:
        self._parents.clear()


class _Present:
    """Whether a tree path exists in ``dest``, as ``lexists`` says, from one ``listdir`` per folder
    (a re-sync of 10,000 unchanged files: ~100 listings, not 10,000 ``lstat`` calls). Listings are
    made on first use and forgotten whenever a folder or link is written (it can change what a
    folder's path leads to)."""

    def __init__(self, dest: str):
        self.dest = dest
        self._names: dict[str, set[str]] = {}

    def __contains__(self, rel: str) -> bool:
        folder, _, name = rel.rpartition("/")
        names = self._names.get(folder)
        if names is None:
            try:
                names = set(os.listdir(os.path.join(self.dest, *folder.split("/")) if folder else self.dest))
            except OSError:
                names = set()
            self._names[folder] = names
        return name in names

    def forget(self) -> None:
        self._names.clear()


def read_state(dest: str) -> dict[str, Row]:
    """``path -> row`` of the manifest last materialised into ``dest`` (empty when none, or unreadable)."""
    try:
        with open(os.path.join(dest, STATE_FILE), "rb") as f:
            return read_rows(f.read())
    except (OSError, ValueError, KeyError, TypeError):
        return {}


class ArrivalLinks:
    """One-chunk files of a sync into a new (or empty) destination, each linked into place the moment
    its chunk is stored, instead of in :func:`materialise` once every chunk is here.

    Why: a tree of small files is a receiver's heaviest case, and :func:`materialise` walking 10,000
    entries after the last chunk (a path check, a ``stat`` and a link each) was a fifth of it; at
    arrival the link is all that is left to do, while the next batch is on its way. Only into a new
    destination: no file of it exists yet, so none is replaced before the sync completes (a failed
    sync leaves complete files only, and no state file, so the next sync checks every one).
    Nothing is written into the destination before the manifest is here and accepted (:meth:`plan`):
    chunks stored before it (the source's hints) are linked then, with the tree's folders made first
    (their modes are set by :func:`materialise`, as before)."""

    def __init__(self, store: ChunkStore, dest: str):
        self.store = store
        self.dest = dest
        self.placed: set[str] = set()
        self._paths: dict[str, str] = {}  # chunk -> the one-chunk file that takes its inode
        self._early: list[str] | None = []  # chunks stored before plan(); None once planned
        try:
            self.active = not os.listdir(dest)
        except FileNotFoundError:
            self.active = True
        self._target = _Targets(dest)

    def plan(self, manifest: TreeManifest, stored_modes: dict[str, int]) -> None:
        """The manifest is here (checked): make its folders, expect its one-chunk files, and link the
        chunks that came before it."""
        early, self._early = self._early or [], None
        if not self.active:
            return
        os.makedirs(self.dest, exist_ok=True)
        for e in manifest.entries:
            if e.kind == Kind.DIR:
                os.makedirs(self._target(e.path), exist_ok=True)
            elif e.kind == Kind.FILE and len(e.chunks) == 1 and stored_modes.get(e.chunks[0]) == e.mode:
                self._paths.setdefault(e.chunks[0], e.path)
        for h in early:
            self.arrived(h)

    def arrived(self, h: str) -> None:
        """Chunk ``h`` was just stored (:meth:`ChunkStore.put`, verified, with its file's mode): link it
        to its file's path (before :meth:`plan`: once the manifest is here); left to :func:`materialise`
        when that fails."""
        if self._early is not None:
            if self.active:
                self._early.append(h)
            return
        path = self._paths.pop(h, None)
        if path is None:
            return
        try:  # put in this sync: no destination file shares its inode yet (see _claim)
            os.link(self.store._path(h), self._target(path))
        except (OSError, UnsafePathError):
            return
        self.placed.add(path)


def materialise(manifest: TreeManifest, store: ChunkStore, dest: str,
                verified: set[str] | frozenset[str] = frozenset(),
                stored_modes: dict[str, int] | None = None, previous: dict[str, Row] | None = None,
                manifest_json: bytes | None = None, placed: set[str] | frozenset[str] = frozenset()) -> MaterialiseResult:
    """Make ``dest`` match ``manifest`` from chunks in ``store`` (all must be present).

    Entries unchanged since the last materialisation into ``dest`` (recorded in
    ``dest/.rlmesh-manifest.json``) are not touched; entries gone are removed.
    Every chunk read back is re-hashed, so a store corrupted on disk is caught, except
    those in ``verified`` (hashed on arrival in this sync), which are copied in the kernel.
    ``stored_modes``: :func:`solo_modes` of the manifest; a chunk of ``verified`` in it was stored
    with that mode (:meth:`ChunkStore.put`), so where its one-chunk file does not exist yet, the
    chunk is hard-linked straight to its path (complete, verified and with its mode before its name
    appears: two system calls a file instead of five, for a tree of small files the receiver's main cost).
    ``previous``: :func:`read_state` of ``dest``, when the caller has read it already (and, when ``manifest``
    came from :meth:`TreeManifest.from_json` with it as ``known``, its rows were compared there: ``same``);
    ``manifest_json``: the bytes ``manifest`` was parsed from, kept as the state file as they are.
    ``placed``: files :class:`ArrivalLinks` linked into place already (counted, not touched).
    """
    stored_modes = stored_modes or {}
    os.makedirs(dest, exist_ok=True)
    state = os.path.join(dest, STATE_FILE)
    old = read_state(dest) if previous is None else previous
    res = MaterialiseResult()
    target = _Targets(dest)
    present = _Present(dest)
    if previous is not None and manifest.same:  # parsed against ``previous`` (from_json's ``known``): compared there
        same: frozenset[str] | set[str] = manifest.same
    else:
        same = {e.path for e in manifest.entries if (row := old.get(e.path)) is not None and row == entry_row(e)}
    for e in manifest.entries:
        if e.path in placed:
            res.linked += 1
            res.files_written += 1
            continue
        if e.path in same and e.path in present:  # path checked when first written
            res.files_unchanged += 1
            continue
        full = target(e.path)
        if e.kind == Kind.DIR:
            if os.path.islink(full):  # a link an older tree had here: the folder replaces it (never chmod through it)
                os.unlink(full)
                target.forget()
            os.makedirs(full, exist_ok=True)
            os.chmod(full, e.mode | 0o700)
            present.forget()
            continue
        if (e.kind == Kind.FILE and len(e.chunks) == 1 and stored_modes.get(e.chunks[0]) == e.mode
                and e.chunks[0] in verified and _claim(store, e.chunks[0], full)):
            if e.path.endswith(".py") and e.path in old:
                _drop_bytecode(full)
            res.linked += 1
            res.files_written += 1
            continue  # was not there: linked into place (a file that exists is replaced below, by rename)
        tmp = os.path.join(os.path.dirname(full), f".rlmesh-tmp-{os.getpid()}-{os.path.basename(full)}")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if e.kind == Kind.SYMLINK:
            check_link(e.path, e.target)
            os.symlink(e.target, tmp)
            target.forget()  # the link may be a folder some later entry's path goes through
            present.forget()
        elif len(e.chunks) == 1 and e.mode & 0o222 == 0 and _try_link(store, e.chunks[0], tmp):
            res.linked += 1  # read-only one-chunk file: shares the store's inode (verified when stored)
        elif len(e.chunks) == 1 and e.chunks[0] in verified and _claim(store, e.chunks[0], tmp):
            os.chmod(tmp, e.mode)  # written once: this file *is* the chunk that arrived (see _claim)
            res.linked += 1
        elif len(e.chunks) > 1 and _assemble(store, e, manifest.chunk_bytes, verified, tmp):
            os.chmod(tmp, e.mode)  # written once: this file *is* the object its chunks arrived in
            res.linked += 1
        else:
            size = 0
            with open(tmp, "wb") as f:
                for h in e.chunks:
                    if h in verified and os.path.exists(store.path(h)):  # hashed on arrival: a kernel-side copy
                        f.flush()
                        size += _copy_into(store.path(h), f.fileno())
                        continue
                    try:
                        data = store.read(h) if h in verified else store.read_verified(h)
                    except CorruptChunkError as exc:
                        raise CorruptChunkError(f"{e.path!r}: {exc}") from None
                    f.write(data)
                    size += len(data)
            if size != e.size:
                os.unlink(tmp)
                raise CorruptChunkError(f"{e.path!r}: {size} bytes from the store, manifest says {e.size}")
            os.chmod(tmp, e.mode)
        os.replace(tmp, full)
        if e.kind == Kind.FILE and e.path.endswith(".py") and e.path in old:
            _drop_bytecode(full)  # same size, same second: the old .pyc would otherwise pass as fresh
        res.files_written += 1
    _links_stay_inside(manifest, dest, target.root)
    keep = {e.path for e in manifest.entries}
    for path in sorted(set(old) - keep, reverse=True):
        full = target(path)
        if os.path.isdir(full) and not os.path.islink(full):
            try:
                os.rmdir(full)
            except OSError:
                pass
        elif os.path.lexists(full):
            os.unlink(full)
        res.files_removed += 1
    tmp_state = state + ".tmp"
    with open(tmp_state, "wb") as f:
        f.write(manifest.to_json() if manifest_json is None else manifest_json)
    os.replace(tmp_state, state)
    return res


def _links_stay_inside(manifest: TreeManifest, dest: str, root: str) -> None:
    """Every symlink of the tree, resolved on disk as it now stands (what this materialisation made
    included), must lead inside ``root``; one that does not is removed and refused. Why here too:
    the manifest's own check (:func:`~rlmesh.workspace.manifest.check_links`) sees only the tree's
    links, not what else is on disk."""
    for e in manifest.entries:
        if e.kind != Kind.SYMLINK:
            continue
        full = os.path.join(dest, *e.path.split("/"))
        real = os.path.realpath(full)
        if real != root and not real.startswith(root + os.sep):
            os.unlink(full)
            raise UnsafePathError(f"symlink {e.path!r} -> {e.target!r} resolves to {real} on disk, outside "
                                  f"{dest}: removed and refused")


def _drop_bytecode(path: str) -> None:
    try:
        os.unlink(importlib.util.cache_from_source(path))
    except (OSError, ValueError, NotImplementedError):
        pass


def _assemble(store: ChunkStore, e: Entry, chunk_bytes: int, verified: set[str] | frozenset[str], tmp: str) -> bool:
    """Complete ``e``'s file object and hard-link it to ``tmp``; False (copy instead) when there is no
    object, or another destination file already shares its inode (an in-place edit of one must not
    change the other).

    Chunks written into the object in this sync were hashed on arrival and are not read again;
    any other chunk (held from an earlier sync, or kept in another file's object) is read back,
    re-hashed and written into place."""
    obj = store.object_path(object_id(e))
    try:
        st = os.stat(obj)
        if st.st_size != e.size or st.st_nlink != 1:
            return False
        fd = os.open(obj, os.O_RDWR)
    except OSError:
        return False
    try:
        for i, h in enumerate(e.chunks):
            off = i * chunk_bytes
            here = store._ref(h) == (obj, off, min(chunk_bytes, e.size - off))
            if here and h in verified:
                continue
            try:
                data = store.read_verified(h)
            except CorruptChunkError as exc:
                raise CorruptChunkError(f"{e.path!r}: {exc}") from None
            if not here:
                _pwrite_all(fd, data, off)
    finally:
        os.close(fd)
    os.link(obj, tmp)
    return True


def _claim(store: ChunkStore, h: str, tmp: str) -> bool:
    """Link a chunk that arrived in this sync and no other file uses yet (one link: the store's) to ``tmp``.

    Why: the bytes were written once, into the store, and verified; the destination file takes the
    same inode instead of a second copy (write once, verify, rename). Only one destination file ever
    shares a chunk's inode with the store (a chunk already linked is copied for any other file), so
    an in-place edit of that file can only corrupt the store's chunk, which every read re-hashes
    (:meth:`ChunkStore.read_verified` drops it, and the next sync fetches it again)."""
    path = store._path(h)  # a hash that arrived in this sync: our own digest, well formed
    try:
        if os.stat(path).st_nlink != 1:
            return False
        os.link(path, tmp)
        return True
    except OSError:
        return False


def _try_link(store: ChunkStore, h: str, tmp: str) -> bool:
    try:
        if os.stat(store.path(h)).st_mode & 0o222:  # claimed by a writable file: its inode is not read-only
            return False
        os.link(store.path(h), tmp)
        return True
    except OSError:
        return False


def _copy_into(src: str, out_fd: int) -> int:
    """Append file ``src`` to ``out_fd`` with ``copy_file_range`` (no user-space copy); returns bytes copied."""
    total = 0
    with open(src, "rb") as f:
        n = os.fstat(f.fileno()).st_size
        while total < n:
            got = os.copy_file_range(f.fileno(), out_fd, n - total)
            if got == 0:
                break
            total += got
    return total
