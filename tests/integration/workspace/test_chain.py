"""Real receiver processes on loopback: chain fan-out, dedup, resume after a kill, corrupt chunk, escaping paths."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlmesh.transport import Authenticator
from rlmesh.workspace import ChunkStore, CorruptChunkError, TreeManifest, UnsafePathError, build_manifest
from rlmesh.workspace.manifest import Entry, Kind
from rlmesh.workspace.serve import ChunkServer, source_lookup
from rlmesh.workspace.transfer import Receiver

SECRET = Authenticator.new_secret()


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv("RLMESH_SECRET", SECRET.hex())


def serve(root, chunk_bytes=1 << 20):
    m = build_manifest(str(root), chunk_bytes=chunk_bytes)
    return ChunkServer(m.to_json(), source_lookup(str(root), m)), m


def node(upstream, tmp, i):
    p = subprocess.Popen([sys.executable, "-m", "rlmesh.workspace.node", "--upstream", upstream,
                          "--store", str(tmp / f"store{i}"), "--dest", str(tmp / f"dest{i}")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    return p, p.stdout.readline().strip()


def result(p):
    line = p.stdout.readline()
    p.stdin.close()
    p.wait(timeout=60)
    return json.loads(line)


def results(procs):
    """Every host's stats, closing none before all are done: a host serves the next until then."""
    lines = [p.stdout.readline() for p in procs]
    for p in procs:
        p.stdin.close()
        p.wait(timeout=60)
    return [json.loads(line) for line in lines]


def make_tree(root, n=50):
    (root / "pkg").mkdir(parents=True)
    for i in range(n):
        (root / "pkg" / f"m{i}.py").write_text(f"V = {i}\n")
    (root / "big.bin").write_bytes(os.urandom(3 << 20))


@pytest.mark.timeout(120)
def test_chain_to_three_procs_then_dedup(tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    server, m = serve(src)
    try:
        procs, up = [], server.addr
        for i in range(3):  # source -> host0 -> host1 -> host2, each forwarding as chunks arrive
            p, up = node(up, tmp_path, i)
            procs.append(p)
        stats = results(procs)
        for i, st in enumerate(stats):
            assert st["error"] == "" and st["bytes_received"] == m.total_bytes and st["cpu_s"] > 0
            assert (tmp_path / f"dest{i}" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
            assert os.stat(tmp_path / f"dest{i}" / "big.bin").st_nlink == 2  # written once: the store's object
        assert server.bytes_sent == m.total_bytes  # the source sent every byte once, not once per host
        # second sync: nothing to send; after a one-line edit: one file's chunk
        p, _ = node(server.addr, tmp_path, 0)
        assert result(p)["bytes_received"] == 0
    finally:
        server.close()
    (src / "pkg" / "m7.py").write_text("V = 'edited'\n")
    server, m = serve(src)
    try:
        p, _ = node(server.addr, tmp_path, 0)
        st = result(p)
        assert st["chunks_received"] == 1 and st["bytes_received"] == len("V = 'edited'\n")
        assert (tmp_path / "dest0" / "pkg" / "m7.py").read_text() == "V = 'edited'\n"
    finally:
        server.close()


@pytest.mark.timeout(120)
def test_killed_receiver_resumes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(48 << 20))
    server, m = serve(src, chunk_bytes=256 << 10)
    try:
        p, _ = node(server.addr, tmp_path, 0)
        store = tmp_path / "store0"
        deadline = time.monotonic() + 60
        while sum(len(f) for _, _, f in os.walk(store)) < 4 and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        held = len(ChunkStore(str(store)).missing(list(m.chunk_sizes())))
        assert not (tmp_path / "dest0" / "big.bin").exists()  # never a partial file
        p, _ = node(server.addr, tmp_path, 0)
        st = result(p)
        assert 0 < st["chunks_received"] == held < len(m.chunk_sizes())  # only what was missing
        assert (tmp_path / "dest0" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    finally:
        server.close()


@pytest.mark.timeout(60)
def test_corrupt_chunk_and_hostile_manifest_rejected(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("A = 1\n")
    m = build_manifest(str(src))
    bad = ChunkServer(m.to_json(), lambda h: b"tampered")
    rx = Receiver(ChunkStore(str(tmp_path / "store")), str(tmp_path / "dest"))
    try:
        with pytest.raises(CorruptChunkError):
            rx.pull(bad.addr, timeout=30)
        assert not (tmp_path / "dest" / "a.py").exists()
    finally:
        bad.close()
    hostile = ChunkServer(TreeManifest([Entry("../escape.py", Kind.FILE, size=0)]).to_json(), lambda h: None)
    try:
        with pytest.raises(UnsafePathError):
            rx.pull(hostile.addr, timeout=30)
        assert not (tmp_path / "escape.py").exists()
    finally:
        hostile.close()
        rx.close()


@pytest.mark.timeout(120)
def test_relink_continues_a_stalled_pull_from_another_upstream(tmp_path):
    """The host before a receiver died (here: an upstream that never sends a chunk, as a dead or
    stuck host does): after ``relink`` the pull continues from the new upstream, asks it for what
    the old one owed, keeps what it stored, and lands the tree whole."""
    import threading

    src = tmp_path / "src"
    make_tree(src, n=20)
    server, m = serve(src, chunk_bytes=256 << 10)
    stalled = ChunkServer(m.to_json(), lambda h: None)  # answers the manifest, parks every chunk request
    rx = Receiver(ChunkStore(str(tmp_path / "store")), str(tmp_path / "dest"))
    got = {}
    t = threading.Thread(target=lambda: got.update(st=rx.pull(stalled.addr, timeout=60)))
    try:
        t.start()
        deadline = time.monotonic() + 60
        while not stalled._parked and time.monotonic() < deadline:  # the receiver asked the stalled one
            time.sleep(0.01)
        assert stalled._parked and t.is_alive()
        rx.relink(server.addr)
        t.join(60)
        st = got["st"]
        assert st.error == "" and st.relinks == 1 and st.bytes_received == m.total_bytes
        assert (tmp_path / "dest" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
        assert (tmp_path / "dest" / "pkg" / "m19.py").read_text() == "V = 19\n"
    finally:
        rx.close()
        stalled.close()
        server.close()


@pytest.mark.timeout(60)
def test_only_a_host_with_a_downstream_keeps_chunks_in_memory_to_forward(tmp_path):
    """The chain's last host has nobody to forward to: it keeps no received frame (each one held
    made the next frame fresh memory to fault in); the host before it keeps them and serves from them."""
    import threading

    src = tmp_path / "src"
    make_tree(src, n=5)
    server, m = serve(src)
    rx = [Receiver(ChunkStore(str(tmp_path / f"store{i}")), str(tmp_path / f"dest{i}")) for i in range(2)]
    try:
        last = threading.Thread(target=rx[1].pull, args=(rx[0].addr, 30))
        last.start()
        deadline = time.monotonic() + 30
        while not rx[0].server.downstream and time.monotonic() < deadline:  # its manifest request came in
            time.sleep(0.01)
        rx[0].pull(server.addr, 30)
        last.join(30)
        assert rx[1].last.error == "" and (tmp_path / "dest1" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
        assert rx[0].server.downstream and not rx[1].server.downstream
        assert all(rx[0]._hot.get(h) is not None for h in m.chunk_sizes())
        assert not any(rx[1]._hot.get(h) is not None for h in m.chunk_sizes())
    finally:
        for r in rx:
            r.close()
        server.close()


@pytest.mark.timeout(90)
def test_small_files_travel_while_the_source_walks_and_a_failed_walk_stops_the_hosts(tmp_path):
    """A source created before its walk (hosts of their own): host 0 stores the small files as the walk
    hashes them, before any manifest exists; the chain then completes as usual. A walk that fails
    reaches the waiting hosts as an error at once."""
    src = tmp_path / "src"
    make_tree(src, n=40)
    lookup = source_lookup(str(src))
    server = ChunkServer(None, lookup, walking=True)
    try:
        procs, up = [], server.addr
        for i in range(2):
            p, up = node(up, tmp_path, i)
            procs.append(p)
        m = lookup.manifest = build_manifest(str(src), chunk_bytes=1 << 20, held=lookup.held, on_hint=server.hint)
        store0 = ChunkStore(str(tmp_path / "store0"))
        small = [e.chunks[0] for e in m.entries if e.path.startswith("pkg/")]
        deadline = time.monotonic() + 60
        while not all(store0.has(h) for h in small) and time.monotonic() < deadline:  # no manifest out yet
            time.sleep(0.02)
        assert all(store0.has(h) for h in small)
        server.publish(m.to_json())
        for i, st in enumerate(results(procs)):
            assert st["error"] == "" and st["bytes_received"] == m.total_bytes
            assert (tmp_path / f"dest{i}" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
            assert (tmp_path / f"dest{i}" / "pkg" / "m39.py").read_text() == "V = 39\n"
        assert os.stat(tmp_path / "dest0" / "pkg" / "m0.py").st_nlink == 2  # took its chunk's inode on arrival
    finally:
        server.close()
    failing = ChunkServer(None, source_lookup(str(src)), walking=True)
    try:
        p, _ = node(failing.addr, tmp_path, 9)
        t0 = time.monotonic()
        failing.fail("UnsafePathError: a symlink out of the root")
        st = result(p)
        assert "a symlink out of the root" in st["error"] and time.monotonic() - t0 < 30
    finally:
        failing.close()
