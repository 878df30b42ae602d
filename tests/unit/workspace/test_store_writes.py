"""The chunk store's writes: complete or absent, read-only chunks, and a temp name left by a dead writer."""

import os
import stat

import pytest

from rlmesh.workspace import store as store_mod
from rlmesh.workspace.store import ChunkStore, CorruptChunkError, chunk_hash


def test_a_put_chunk_is_read_only_and_leaves_no_temporary_file(tmp_path):
    s = ChunkStore(str(tmp_path / "store"))
    data = b"x = 1\n" * 10
    h = chunk_hash(data)
    s.put(h, data)
    assert s.read_verified(h) == data
    assert stat.S_IMODE(os.stat(s.path(h)).st_mode) == 0o444
    assert os.listdir(os.path.dirname(s.path(h))) == [h]


def test_a_temporary_name_left_by_a_killed_writer_is_replaced(tmp_path, monkeypatch):
    s = ChunkStore(str(tmp_path / "store"))
    data = b"payload"
    h = chunk_hash(data)
    monkeypatch.setattr(store_mod, "_TMP_IDS", iter([7]))
    os.makedirs(os.path.dirname(s.path(h)))
    stale = f"{s.path(h)}.part-{os.getpid()}-7"
    with open(stale, "wb") as f:  # a writer with this pid (reused) and counter died mid-write
        f.write(b"half")
    s.put(h, data)
    assert s.read_verified(h) == data and not os.path.exists(stale)


def test_a_corrupt_chunk_is_never_written(tmp_path):
    s = ChunkStore(str(tmp_path / "store"))
    with pytest.raises(CorruptChunkError):
        s.put(chunk_hash(b"right"), b"wrong")
    assert not s.has(chunk_hash(b"right"))
    assert all(not files for _, _, files in os.walk(tmp_path / "store"))


def test_chunks_are_blake3_and_a_store_of_the_older_hash_is_never_read(tmp_path):
    """A chunk an older rlmesh stored (BLAKE2b layout: ``base/ab/<hash>``) is not found, so it is fetched
    again and verified as BLAKE3, never served as one."""
    import hashlib

    from blake3 import blake3

    data = b"import os\n"
    assert chunk_hash(data) == blake3(data).hexdigest() != hashlib.blake2b(data, digest_size=32).hexdigest()
    base = tmp_path / "store"
    h = chunk_hash(data)
    (base / h[:2]).mkdir(parents=True)
    (base / h[:2] / h).write_bytes(b"bytes an old layout kept under this name")
    s = ChunkStore(str(base))
    assert not s.has(h) and s.missing([h]) == [h]
    s.put(h, data)
    assert s.read_verified(h) == data and s.path(h).startswith(str(base / store_mod.LAYOUT) + os.sep)


def test_into_a_new_destination_a_file_is_linked_in_as_its_chunk_arrives(tmp_path):
    """Into a new destination, a one-chunk file takes its chunk's inode when the chunk is stored, or, for
    one stored before the manifest (a hint), once the manifest is planned: nothing is written into the
    destination before that. Materialise only counts them. A destination that holds files is left to it."""
    from rlmesh.workspace import build_manifest, materialise
    from rlmesh.workspace.store import ArrivalLinks, placement, solo_modes

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "b.txt").write_text("b\n")
    (src / "c.txt").write_text("c\n")
    os.chmod(src / "b.txt", 0o600)
    m = build_manifest(str(src))
    modes = solo_modes(m, placement(m, list(m.chunk_sizes())))
    a, b, c = chunk_hash(b"A = 1\n"), chunk_hash(b"b\n"), chunk_hash(b"c\n")
    s = ChunkStore(str(tmp_path / "store"))
    dest = tmp_path / "dest"
    links = ArrivalLinks(s, str(dest))
    assert links.active
    s.put(a, b"A = 1\n", modes[a])
    links.arrived(a)  # before the manifest: nothing in the destination yet
    assert not dest.exists()
    links.plan(m, modes)
    got = dest / "pkg" / "a.py"
    assert got.read_text() == "A = 1\n" and os.stat(got).st_ino == os.stat(s.path(a)).st_ino
    s.put(b, b"b\n", modes[b])
    links.arrived(b)  # after it: linked on arrival
    assert links.placed == {"pkg/a.py", "b.txt"} and stat.S_IMODE(os.stat(dest / "b.txt").st_mode) == 0o600
    s.put(c, b"c\n", modes[c])  # not announced: materialise links it
    res = materialise(m, s, str(dest), {a, b, c}, modes, placed=links.placed)
    assert res.files_written == 3 and res.linked == 3 and (dest / "c.txt").read_text() == "c\n"
    assert not ArrivalLinks(s, str(dest)).active  # holds files now: left to materialise
