"""TreeManifest walk, exclusions, path refusal and materialisation from a store (pure filesystem, no sockets)."""

import fnmatch
import os
import random

import pytest

from rlmesh.workspace import ChunkStore, CorruptChunkError, TreeManifest, UnsafePathError, build_manifest, materialise
from rlmesh.workspace.manifest import DEFAULT_EXCLUDES, Entry, Kind, _Excluder
from rlmesh.workspace.store import solo_modes


def tree(root):
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    os.symlink("pkg/__init__.py", root / "link.py")
    for d in (".git", ".venv-x", "runs", "pkg/__pycache__", "data"):
        (root / d).mkdir(exist_ok=True)
        (root / d / "f").write_text("skip")
    (root / ".gitignore").write_text("data/\n*.log\n")
    (root / "a.log").write_text("skip")


def test_exclusions_modes_symlinks(tmp_path):
    tree(tmp_path)
    m = build_manifest(str(tmp_path))
    paths = {e.path: e for e in m.entries}
    assert set(paths) == {"pkg", "pkg/__init__.py", "run.sh", "link.py", ".gitignore"}
    assert paths["run.sh"].mode == 0o755
    assert paths["link.py"].kind == Kind.SYMLINK and paths["link.py"].target == "pkg/__init__.py"


def test_escaping_paths_refused_on_both_sides(tmp_path):
    os.symlink("/etc/passwd", tmp_path / "abs")
    with pytest.raises(UnsafePathError, match="absolute"):
        build_manifest(str(tmp_path))
    os.unlink(tmp_path / "abs")
    os.symlink("../../x", tmp_path / "up")
    with pytest.raises(UnsafePathError, match="outside"):
        build_manifest(str(tmp_path))
    os.unlink(tmp_path / "up")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePathError, match="FIFO"):
        build_manifest(str(tmp_path))
    for bad in ["../evil", "/etc/evil", "a/../../b"]:  # a hostile manifest, as a receiver reads it
        with pytest.raises(UnsafePathError):
            TreeManifest.from_json(TreeManifest([Entry(bad, Kind.FILE)]).to_json())
    with pytest.raises(UnsafePathError):
        TreeManifest.from_json(TreeManifest([Entry("l", Kind.SYMLINK, target="/etc")]).to_json())


def fill(store, root, m):
    for e in m.entries:
        if e.kind == Kind.FILE:
            data = (root / e.path).read_bytes()
            for i, h in enumerate(e.chunks):
                store.put(h, data[i * m.chunk_bytes:(i + 1) * m.chunk_bytes])


def test_materialise_then_incremental(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    tree(src)
    (src / "big.bin").write_bytes(os.urandom(5000))
    store = ChunkStore(str(tmp_path / "store"))
    m = build_manifest(str(src), chunk_bytes=1024)
    assert len(next(e for e in m.entries if e.path == "big.bin").chunks) == 5
    fill(store, src, m)
    materialise(m, store, str(dst))
    assert (dst / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert os.readlink(dst / "link.py") == "pkg/__init__.py" and os.access(dst / "run.sh", os.X_OK)
    (src / "pkg" / "__init__.py").write_text("X = 2\n")
    m2 = build_manifest(str(src), chunk_bytes=1024)
    assert len(store.missing(list(m2.chunk_sizes()))) == 1  # one edited file -> one new chunk
    fill(store, src, m2)
    res = materialise(m2, store, str(dst))
    assert res.files_written == 1 and (dst / "pkg" / "__init__.py").read_text() == "X = 2\n"


def test_corrupt_chunk_rejected(tmp_path):
    from rlmesh.workspace import CorruptChunkError
    from rlmesh.workspace.store import chunk_hash

    store = ChunkStore(str(tmp_path))
    with pytest.raises(CorruptChunkError):
        store.put(chunk_hash(b"good"), b"evil")
    assert not store.has(chunk_hash(b"good"))


def test_arrived_chunk_written_once_and_an_in_place_edit_is_caught(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "a.py").write_text("same\n")
    (src / "b.py").write_text("same\n")  # same bytes: one chunk, two files
    m = build_manifest(str(src))
    store = ChunkStore(str(tmp_path / "store"))
    (h,) = {e.chunks[0] for e in m.entries}
    store.put(h, b"same\n")
    res = materialise(m, store, str(dest), verified={h})
    a, b, chunk = os.stat(dest / "a.py"), os.stat(dest / "b.py"), os.stat(store.path(h))
    assert res.linked == 1 and a.st_ino == chunk.st_ino and a.st_nlink == 2  # a.py is the stored chunk itself
    assert b.st_ino != chunk.st_ino and oct(a.st_mode & 0o777) == oct(b.st_mode & 0o777) == oct(0o644)
    with open(dest / "a.py", "r+") as f:  # edited in place: the store's copy changes with it
        f.write("edit")
    with pytest.raises(CorruptChunkError, match="corrupt on disk"):
        store.read_verified(h)
    assert not store.has(h)  # dropped: the next sync fetches it again


def test_a_multi_chunk_file_is_written_once_into_its_object_and_linked(tmp_path):
    """Chunks of a file of several chunks land in that file's object as they arrive (one write each);
    the destination file is the object itself. A second file with the same bytes is copied (never two
    destination files on one inode); an in-place edit of the linked file is caught on the next read."""
    from rlmesh.workspace.store import chunk_hash, object_id, placement

    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    blob = os.urandom(4500)
    (src / "big.bin").write_bytes(blob)
    (src / "copy.bin").write_bytes(blob)  # same chunks, same object id
    (src / "tail.bin").write_bytes(blob[1024:2048])  # a one-chunk file whose chunk also lives in big.bin
    m = build_manifest(str(src), chunk_bytes=1024)
    store = ChunkStore(str(tmp_path / "store"))
    big = next(e for e in m.entries if e.path == "big.bin")
    where = placement(m, store.missing(list(m.chunk_sizes())))
    assert set(where) == set(big.chunks)  # every chunk has a place in big.bin's object
    for i, h in enumerate(big.chunks):  # as a receiver does on arrival
        store.put_in_object(h, blob[i * 1024:(i + 1) * 1024], *where[h])
    assert not os.path.exists(store.path(big.chunks[1])) and store.has(big.chunks[1])  # a reference, not a copy
    res = materialise(m, store, str(dest), verified=set(big.chunks))
    obj = os.stat(store.object_path(object_id(big)))
    got = {p: os.stat(dest / p) for p in ("big.bin", "copy.bin", "tail.bin")}
    assert {p: (dest / p).read_bytes() for p in got} == {"big.bin": blob, "copy.bin": blob, "tail.bin": blob[1024:2048]}
    linked = [p for p, st in got.items() if st.st_ino == obj.st_ino]
    assert len(linked) == 1 and obj.st_nlink == 2 and res.linked == 1  # one of the two, the other copied
    assert store.read_verified(chunk_hash(blob[1024:2048])) == blob[1024:2048]  # forwarded from the object
    with open(dest / linked[0], "r+b") as f:  # edited in place: the object changes with it
        f.write(b"edit")
    with pytest.raises(CorruptChunkError, match="corrupt on disk"):
        store.read_verified(big.chunks[0])
    assert not store.has(big.chunks[0]) and store.has(big.chunks[1])  # only what changed is fetched again


def test_a_chunk_stored_with_its_files_mode_is_linked_straight_into_place(tmp_path):
    """The receiver's fast path for small files: the chunk is made with the file's mode, so the file
    takes its inode with no chmod and no temporary name; a file that already exists is replaced by
    rename as before, and a second file with the same bytes gets a copy."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "run.sh").write_text("echo hi\n")
    os.chmod(src / "run.sh", 0o750)
    (src / "copy.sh").write_text("echo hi\n")
    os.chmod(src / "copy.sh", 0o750)
    m = build_manifest(str(src))
    store = ChunkStore(str(tmp_path / "store"))
    (h,) = {e.chunks[0] for e in m.entries}
    modes = solo_modes(m, {})
    assert modes == {h: 0o750}
    store.put(h, b"echo hi\n", modes[h])
    res = materialise(m, store, str(dest), verified={h}, stored_modes=modes)
    first, second = sorted(["copy.sh", "run.sh"])  # manifest order: the first file takes the inode
    a, b, chunk = os.stat(dest / first), os.stat(dest / second), os.stat(store.path(h))
    assert a.st_ino == chunk.st_ino and a.st_nlink == 2 and b.st_ino != chunk.st_ino
    assert oct(a.st_mode & 0o777) == oct(b.st_mode & 0o777) == oct(0o750)
    assert res.files_written == 2 and res.linked == 1
    assert not [n for n in os.listdir(dest) if n.startswith(".rlmesh-tmp")]
    # the next sync changes the file: it exists, so the new chunk goes in by temp name + rename
    (src / first).write_text("echo bye\n")
    m2 = build_manifest(str(src))
    h2 = next(e.chunks[0] for e in m2.entries if e.path == first)
    modes2 = solo_modes(m2, {})
    store.put(h2, b"echo bye\n", modes2[h2])
    materialise(m2, store, str(dest), verified={h2}, stored_modes=modes2)
    assert (dest / first).read_text() == "echo bye\n" and os.stat(dest / first).st_ino == os.stat(store.path(h2)).st_ino
    assert oct(os.stat(dest / first).st_mode & 0o777) == oct(0o750)


def _one_by_one(rel, is_dir, patterns):
    """The exclusion rule, pattern by pattern with fnmatch (what the compiled matcher must agree with)."""
    name = rel.rsplit("/", 1)[-1]
    for pat in patterns:
        dir_only, p = pat.endswith("/"), pat.rstrip("/")
        if dir_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(rel, p.lstrip("/")) if "/" in p.lstrip("/") else fnmatch.fnmatchcase(name, p):
            return True
    return False


def test_compiled_exclusions_agree_with_fnmatch_pattern_by_pattern():
    rnd = random.Random(7)
    patterns = (*DEFAULT_EXCLUDES, "*.pyc", "build/", "/dist", "docs/*.md", "a/b/", "[ab]*x", "?", "data/*/raw/")
    parts = ["a", "b", "x", ".git", ".venv1", "runs", "__pycache__", "m.pyc", "build", "dist", "docs", "r.md", "data",
             "raw", "ax", "zz"]
    match = _Excluder(patterns)
    seen = set()
    for _ in range(3000):
        rel, is_dir = "/".join(rnd.choice(parts) for _ in range(rnd.randint(1, 4))), rnd.random() < 0.5
        expected = _one_by_one(rel, is_dir, patterns)
        assert match(rel, is_dir) == expected, (rel, is_dir)
        seen.add(expected)
    assert seen == {True, False}


def test_a_manifest_hashed_another_way_is_refused_before_anything_is_used(tmp_path):
    """A peer on an older rlmesh (BLAKE2b chunk hashes, no ``hash`` key) is named as such, not
    reported chunk by chunk as corrupt."""
    import json

    from rlmesh.workspace.manifest import HASH, HashMismatchError

    (tmp_path / "a.py").write_text("A = 1\n")
    raw = json.loads(build_manifest(str(tmp_path)).to_json())
    assert raw["hash"] == HASH == "blake3"
    for hash_key in ({"hash": "blake2b"}, {}):
        old = {**{k: v for k, v in raw.items() if k != "hash"}, **hash_key}
        with pytest.raises(HashMismatchError, match="another rlmesh version"):
            TreeManifest.from_json(json.dumps(old).encode())


def test_the_source_serves_a_small_file_as_walked_and_reads_it_again_when_asked_twice(tmp_path):
    """The walk keeps small files' bytes: the source sends what it hashed (an edit since the walk
    cannot go out under the old hash), each once; asked again (a relinked host), it reads the file."""
    from rlmesh.workspace.serve import source_lookup
    from rlmesh.workspace.store import chunk_hash

    (tmp_path / "a.py").write_text("A = 1\n")
    (tmp_path / "big.bin").write_bytes(os.urandom(3000))
    m = build_manifest(str(tmp_path), chunk_bytes=1024)
    h = chunk_hash(b"A = 1\n")
    assert list(m.held) == [h]  # the three-chunk file is read from disk when asked
    (tmp_path / "a.py").write_text("A = 2\n")
    lookup = source_lookup(str(tmp_path), m)
    assert lookup(h) == b"A = 1\n" and not m.held
    assert lookup(h) == b"A = 2\n"  # from the file: a receiver rejects it (its hash is not h)


def test_a_small_file_that_grew_since_its_stat_is_hashed_whole(tmp_path):
    from rlmesh.workspace.manifest import hash_chunks

    p = tmp_path / "grows.txt"
    p.write_bytes(b"x" * 5000)
    held: dict[str, bytes] = {}
    assert hash_chunks(str(p), 4096, held, size_hint=100) == hash_chunks(str(p), 4096)
    size, chunks = hash_chunks(str(p), 1 << 20, held, size_hint=10)
    assert size == 5000 and len(chunks) == 1 and not held  # read the general way, not kept
    assert hash_chunks(str(p), 1 << 20, held, size_hint=5000) == (size, chunks) and list(held) == list(chunks)
    (tmp_path / "empty").write_bytes(b"")
    assert hash_chunks(str(tmp_path / "empty"), 1 << 20, held, size_hint=0) == (0, ())
