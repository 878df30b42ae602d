"""What a re-sync skips, and what it still notices (issue 40: a one-line edit of a 10,000-file tree).

The sender keeps each file's entry while its (size, mtime_ns, inode, mode) stay the same; the
receiver does not re-check rows it accepted before, answers "held?" from folder listings, and
tells unchanged files from one listing per folder. Each shortcut is tested against the case it
must not miss."""

import json
import os

import pytest

from rlmesh.workspace import ChunkStore, CorruptChunkError, TreeManifest, UnsafePathError, build_manifest, materialise
from rlmesh.workspace import store as store_mod
from rlmesh.workspace.manifest import Entry, Kind, forget_walks, read_rows
from rlmesh.workspace.store import STATE_FILE, chunk_hash, read_state


def _hashes(root):
    return {e.path: e.chunks for e in build_manifest(str(root)).entries if e.kind == Kind.FILE}


def test_the_walk_cache_rehashes_any_change_of_size_mtime_inode_or_mode(tmp_path):
    (tmp_path / "a.py").write_text("A = 1\n")
    (tmp_path / "b.py").write_text("B = 1\n")
    first = _hashes(tmp_path)
    st = os.stat(tmp_path / "a.py")
    (tmp_path / "new").write_text("A = 2\n")  # same size, and given the same mtime: only the inode differs
    os.utime(tmp_path / "new", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp_path / "new", tmp_path / "a.py")
    assert _hashes(tmp_path)["a.py"] != first["a.py"]
    with open(tmp_path / "b.py", "w") as f:  # in place, same size: the mtime moves
        f.write("B = 2\n")
    os.utime(tmp_path / "b.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert _hashes(tmp_path)["b.py"] != first["b.py"]
    os.chmod(tmp_path / "b.py", 0o600)
    assert next(e for e in build_manifest(str(tmp_path)).entries if e.path == "b.py").mode == 0o600


def test_the_walk_cache_does_not_see_an_in_place_edit_that_keeps_size_and_mtime(tmp_path):
    """The documented limit (as rsync's quick check): bytes rewritten in place, same size, mtime set
    back. A new controller process (an empty cache) hashes the file again."""
    (tmp_path / "a.py").write_text("A = 1\n")
    before = _hashes(tmp_path)["a.py"]
    st = os.stat(tmp_path / "a.py")
    with open(tmp_path / "a.py", "r+") as f:
        f.write("A = 2\n")
    os.utime(tmp_path / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _hashes(tmp_path)["a.py"] == before
    forget_walks()  # what a new controller process starts with (and each initial benchmark sample)
    assert _hashes(tmp_path)["a.py"] == (chunk_hash(b"A = 2\n"),)


def test_known_rows_skip_only_their_own_checks(tmp_path):
    """Rows accepted before are not re-checked; a new row is, and links are always checked together
    (an unchanged ``d/up -> ..`` plus a new ``esc -> d/up/..`` leads out)."""
    safe = TreeManifest([Entry("d", Kind.DIR), Entry("d/up", Kind.SYMLINK, 0o777, target="..")])
    known = read_rows(safe.to_json())
    assert [e.path for e in TreeManifest.from_json(safe.to_json(), known).entries] == ["d", "d/up"]
    for bad in ("../x", ".", "d/./x", "d//x"):
        with pytest.raises(UnsafePathError, match="escapes"):
            TreeManifest.from_json(TreeManifest([*safe.entries, Entry(bad, Kind.FILE)]).to_json(), known)
    esc = TreeManifest([*safe.entries, Entry("esc", Kind.SYMLINK, 0o777, target="d/up/..")])
    with pytest.raises(UnsafePathError, match="outside the workspace root"):
        TreeManifest.from_json(esc.to_json(), known)


@pytest.mark.parametrize("list_at", [1, 10**9], ids=["listed", "stat-each"])
def test_missing_answers_the_same_from_a_listing(tmp_path, monkeypatch, list_at):
    monkeypatch.setattr(store_mod, "_LIST_AT", list_at)
    store = ChunkStore(str(tmp_path))
    held = [os.urandom(8) for _ in range(20)]
    for d in held:
        store.put(chunk_hash(d), d)
    blob = os.urandom(64)
    ref = chunk_hash(blob[:32])
    store.put_in_object(ref, blob[:32], "0" * 64, 0, 64)  # held as a reference into a file object
    absent = [chunk_hash(os.urandom(8)) for _ in range(5)]
    asked = [*map(chunk_hash, held), ref, *absent]
    assert store.missing(asked) == absent
    with pytest.raises(CorruptChunkError, match="not a chunk hash"):
        store.missing(["../" + "0" * 61] * 10)


def test_an_unchanged_file_deleted_from_the_destination_comes_back(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "pkg").mkdir(parents=True)
    for i in range(3):
        (src / "pkg" / f"m{i}.py").write_text(f"X = {i}\n")
    store = ChunkStore(str(tmp_path / "store"))
    m = build_manifest(str(src))
    for e in m.entries:
        if e.kind == Kind.FILE:
            store.put(e.chunks[0], (src / e.path).read_bytes())
    materialise(m, store, str(dest))
    os.unlink(dest / "pkg" / "m1.py")
    res = materialise(m, store, str(dest), previous=read_state(str(dest)))
    assert res.files_written == 1 and (dest / "pkg" / "m1.py").read_text() == "X = 1\n"
    assert res.files_unchanged == len(m.entries) - 1


def test_a_state_file_from_before_rows_were_arrays_still_counts(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "a.py").write_text("A = 1\n")
    store = ChunkStore(str(tmp_path / "store"))
    m = build_manifest(str(src))
    store.put(m.entries[0].chunks[0], b"A = 1\n")
    materialise(m, store, str(dest))
    e = m.entries[0]
    old_format = {"chunk_bytes": m.chunk_bytes, "entries": [{"path": e.path, "kind": "file", "mode": e.mode,
                                                             "size": e.size, "chunks": list(e.chunks), "target": ""}]}
    (dest / STATE_FILE).write_text(json.dumps(old_format))
    assert materialise(m, store, str(dest)).files_unchanged == 1


def test_a_rewalk_sends_the_bytes_a_fresh_encoding_would(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / 'q"uo te.py').write_text("é = 1\n")
    (tmp_path / "d" / "x.bin").write_bytes(os.urandom(3000))
    os.symlink("x.bin", tmp_path / "d" / "ln")
    for _ in range(2):  # the first walk encodes each row; the second joins the rows kept from it
        m = build_manifest(str(tmp_path), chunk_bytes=1024)
        assert m.to_json() == TreeManifest(m.entries, m.chunk_bytes).to_json()
    (tmp_path / "d" / "x.bin").write_bytes(os.urandom(10))
    m = build_manifest(str(tmp_path), chunk_bytes=1024)
    assert m.to_json() == TreeManifest(m.entries, m.chunk_bytes).to_json()


def test_rows_equal_to_the_state_are_marked_same_and_others_are_written(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    for i in range(3):
        (src / f"m{i}.py").write_text(f"X = {i}\n")
    store = ChunkStore(str(tmp_path / "store"))

    def sync() -> tuple[TreeManifest, int]:
        m = build_manifest(str(src))
        for e in m.entries:
            store.put(e.chunks[0], (src / e.path).read_bytes())
        prev = read_state(str(dest))
        parsed = TreeManifest.from_json(m.to_json(), prev)
        return parsed, materialise(parsed, store, str(dest), previous=prev).files_written

    assert sync()[1] == 3
    (src / "m1.py").write_text("X = 'edited'\n")
    parsed, written = sync()
    assert parsed.same == {"m0.py", "m2.py"} and written == 1
    assert (dest / "m1.py").read_text() == "X = 'edited'\n"
