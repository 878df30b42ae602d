"""One-sided chunk transfer with real receiver processes: the window protocol end to end over
CMA (``process_vm_readv``: the same protocol as RDMA, runnable without a device), the fallback to
TCP on a link that cannot READ, a corrupted window refused, and RDMA itself where a device exists."""

import json
import os
import subprocess
import sys

import pytest

from rlmesh.transport import Authenticator
from rlmesh.transport.rdma_plan import available
from rlmesh.workspace import ChunkStore, CorruptChunkError, build_manifest
from rlmesh.workspace import onesided_io
from rlmesh.workspace.serve import ChunkServer, source_lookup
from rlmesh.workspace.transfer import Receiver

SECRET = Authenticator.new_secret()
_rdma_ok, _rdma_why = available()


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv("RLMESH_SECRET", SECRET.hex())


def make_tree(root):
    (root / "pkg").mkdir(parents=True)
    for i in range(300):
        (root / "pkg" / f"m{i}.py").write_text(f"V = {i}\n" * (i % 7 + 1))
    (root / "big.bin").write_bytes(os.urandom(40 << 20))  # more than one ring: the window wraps and waits for acks
    (root / "mid.bin").write_bytes(os.urandom(3 << 20))


def node(upstream, tmp, i, transport):
    p = subprocess.Popen([sys.executable, "-m", "rlmesh.workspace.node", "--upstream", upstream, "--transport", transport,
                          "--store", str(tmp / f"store{i}"), "--dest", str(tmp / f"dest{i}")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    return p, p.stdout.readline().strip()


def results(procs):
    """Every host's stats; a host keeps serving until all are done (a host that started late still
    pulls from the one before it)."""
    lines = [p.stdout.readline() for p in procs]
    for p in procs:
        p.stdin.close()
        p.wait(timeout=120)
    return [json.loads(line) for line in lines]


def same_tree(a, b):
    for dirpath, _, files in os.walk(a):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), a)
            with open(os.path.join(a, rel), "rb") as x, open(os.path.join(b, rel), "rb") as y:
                assert x.read() == y.read(), rel


def chain(tmp_path, transport, hosts=3):
    src = tmp_path / "src"
    make_tree(src)
    m = build_manifest(str(src), chunk_bytes=1 << 20)
    server = ChunkServer(m.to_json(), source_lookup(str(src), m))
    try:
        procs, up = [], server.addr
        for i in range(hosts):
            p, up = node(up, tmp_path, i, transport)
            procs.append(p)
        stats = results(procs)
    finally:
        server.close()
    for i, st in enumerate(stats):
        assert st["error"] == "" and st["bytes_received"] == m.total_bytes, st
        same_tree(src, tmp_path / f"dest{i}")
    assert server.bytes_sent == m.total_bytes  # the source placed every byte once, not once per host
    return stats


@pytest.mark.timeout(180)
def test_chain_over_cma_reads_every_chunk_from_the_upstream_window(tmp_path):
    stats = chain(tmp_path, "cma")
    assert [st["transport"] for st in stats] == ["cma"] * 3


@pytest.mark.timeout(120)
def test_rdma_asked_for_without_a_device_falls_back_to_tcp(tmp_path):
    if _rdma_ok:
        pytest.skip("an RDMA device exists here: the RDMA test below covers this link")
    stats = chain(tmp_path, "rdma", hosts=2)
    assert [st["transport"] for st in stats] == ["tcp", "tcp"]


@pytest.mark.rdma
@pytest.mark.timeout(180)
def test_chain_over_rdma(tmp_path):
    if not _rdma_ok:
        pytest.skip(f"needs an RDMA device: {_rdma_why}")
    stats = chain(tmp_path, "rdma")
    assert [st["transport"] for st in stats] == ["rdma"] * 3


@pytest.mark.timeout(120)
def test_a_window_this_host_cannot_read_falls_back_to_tcp(tmp_path, monkeypatch):
    """The upstream opened a window the receiver refuses (here: on 'another machine'): batches it
    already placed are asked for again, the window is closed, and the rest comes over TCP."""
    src = tmp_path / "src"
    make_tree(src)
    m = build_manifest(str(src), chunk_bytes=1 << 20)
    real = onesided_io.CmaWindow.describe
    monkeypatch.setattr(onesided_io.CmaWindow, "describe", lambda self: {**real(self), "machine": "elsewhere"})
    server = ChunkServer(m.to_json(), source_lookup(str(src), m))
    rx = Receiver(ChunkStore(str(tmp_path / "store")), str(tmp_path / "dest"), transport="cma")
    try:
        st = rx.pull(server.addr, timeout=60)
    finally:
        rx.close()
        server.close()
    assert st.transport == "tcp" and st.bytes_received == m.total_bytes
    same_tree(src, tmp_path / "dest")
    assert not server._windows  # closed on the receiver's word


@pytest.mark.timeout(120)
def test_a_chunk_corrupted_in_the_window_is_refused(tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    m = build_manifest(str(src), chunk_bytes=1 << 20)
    place = onesided_io.Window.place

    def flip(self, datas):  # the upstream's memory changes after the copy, before the READ
        got = place(self, datas)
        if got is not None:
            off = got[1][0][0]
            self.mem.map[off] ^= 0xFF
        return got

    monkeypatch.setattr(onesided_io.Window, "place", flip)
    server = ChunkServer(m.to_json(), source_lookup(str(src), m))
    rx = Receiver(ChunkStore(str(tmp_path / "store")), str(tmp_path / "dest"), transport="cma")
    try:
        with pytest.raises(CorruptChunkError):
            rx.pull(server.addr, timeout=30)
    finally:
        rx.close()
        server.close()
    assert not (tmp_path / "dest" / "pkg" / "a.py").exists()


def test_a_placement_outside_the_window_is_never_read(tmp_path):
    p = onesided_io.CmaPuller()
    p.attach({"machine": p.machine, "pid": os.getpid(), "addr": 4096, "length": 100})
    with pytest.raises(ValueError, match="outside the upstream's window"):
        p.read([(90, 20)])
    with pytest.raises(onesided_io.OneSidedError, match="another machine"):
        p.attach({"machine": "x", "pid": 1, "addr": 1, "length": 1})
    p.close()
