"""A weight-sync reader's memory stays bounded over repeated versions: measured per round, not once.

What a reader may hold besides its target: the shm reader copies straight out of the publisher's
slots, so its private memory does not move (the slots it maps are the publisher's pages, counted
in its RSS as shared: ``keep`` of them, and one spare at most); the TCP reader keeps one staging
buffer of one version (pulling into a module, the module's old buffer becomes the next staging
buffer). A reader that kept a buffer, a mapping or a tensor per version would grow by a version
a round.
"""

import json
import os
import subprocess
import sys

import torch

from rlmesh.transport import Authenticator
from rlmesh.weights import Publisher

HERE = os.path.dirname(__file__)
MiB = 1 << 20
VERSION = 24 * MiB
ROUNDS = 8
SLACK = 24 * MiB  # the connection's own buffers (TCP chunks in flight, the zmq I/O thread's heap)


def start_reader(tmp_path, monkeypatch, job: str, size: int, **env: str):
    """memory_reader.py in its own process, reading versions of ``size`` bytes, and the function
    that sends it one command line and returns its JSON answer."""
    env = {"RLMESH_WEIGHTS_DIRECTORY": str(tmp_path / "dir"), "RLMESH_JOB_ID": f"{job}{os.getpid()}",
           "RLMESH_SECRET": Authenticator.new_secret().hex(), "RLMESH_TELEMETRY": "0", "OMP_NUM_THREADS": "1", **env}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reader = subprocess.Popen([sys.executable, os.path.join(HERE, "memory_reader.py"), str(size)],
                              env=dict(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(line: str) -> dict:
        reader.stdin.write(line + "\n")
        reader.stdin.flush()
        got = reader.stdout.readline()
        assert got, f"the reader process died at {line!r}"
        return json.loads(got)

    return reader, ask


def test_reader_memory_does_not_grow_with_versions(tmp_path, monkeypatch):
    reader, ask = start_reader(tmp_path, monkeypatch, "mem", VERSION)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # OpenMP workers spinning on 2 busy cores make each 24 MiB fill take 0.3 s
    state = {f"l{i}.w": torch.empty(VERSION // 16 // 4) for i in range(16)}
    version, seen = 0, {}
    try:
        with Publisher("memory") as pub:
            for kind in ("dict", "module"):
                before = ask(f"base {kind}")
                for transport in ("shm", "tcp"):
                    rounds = []
                    for _ in range(ROUNDS):
                        version += 1
                        for t in state.values():
                            t.fill_(version)
                        pub.publish(state, version=version)
                        rounds.append(ask(f"{transport} {kind} {version}"))
                    seen[(transport, kind)] = (before, rounds)
                    before = rounds[-1]
            reader.stdin.write("\n")
            reader.stdin.flush()
            assert reader.wait(timeout=30) == 0
    finally:
        torch.set_num_threads(threads)
        if reader.poll() is None:
            reader.kill()
            reader.wait()

    for (transport, kind), (before, rounds) in seen.items():
        private = [r["RssAnon"] for r in rounds]
        shared = [r["RssShmem"] for r in rounds]
        what = (f"{transport} reader into a {kind}: private MiB {before['RssAnon'] // MiB} before, "
                f"{[p // MiB for p in private]} per round; shared {[s // MiB for s in shared]}")
        # Flat once both of the publisher's slots (and both TCP staging buffers) are in use: a buffer
        # kept per version would add 24 MiB a round, 5 versions over the last rounds.
        assert max(private[-3:]) - min(private[1:3]) < VERSION, what
        # One staging buffer over TCP, and into a module the buffer it let go of (its first one, or the
        # module's own tensors, which the allocator may keep for reuse); nothing private from shm.
        versions = 2 if transport == "tcp" else 0
        assert private[-1] - before["RssAnon"] < versions * VERSION + SLACK, what
        assert max(shared) <= 3 * (VERSION + MiB), what


BUSY_VERSION = 64 * MiB
WINDOW_MIB = 4


def test_tcp_reader_holds_at_most_its_window_besides_staging(tmp_path, monkeypatch):
    """A reader whose thread is busy (a generator's own work) takes chunks off the socket late; what it
    has asked for and not taken waits in libzmq's queue, in its memory. It used to ask for every chunk
    of up to 512 MiB at once (64 MiB here: all of it); now for ``RLMESH_WEIGHTS_TCP_WINDOW_MIB``."""
    reader, ask = start_reader(tmp_path, monkeypatch, "win", BUSY_VERSION, RLMESH_WEIGHTS_TCP_WINDOW_MIB=str(WINDOW_MIB))
    state = {f"l{i}.w": torch.full((BUSY_VERSION // 16 // 4,), 1.0) for i in range(16)}
    peaks = []
    try:
        with Publisher("memory") as pub:
            ask("base dict")
            for version in (1, 2):
                for t in state.values():
                    t.fill_(version)
                pub.publish(state, version=version)
                if version == 1:
                    ask(f"tcp dict {version}")  # makes the reader and its staging buffer (one version)
                else:  # reuses that buffer: all it may add is what it asked for and has not taken
                    peaks.append(ask(f"busy dict {version}")["peak_extra"])
            reader.stdin.write("\n")
            reader.stdin.flush()
            assert reader.wait(timeout=30) == 0
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    busy = [p // MiB for p in peaks]
    print(f"\nbusy TCP reader, {BUSY_VERSION // MiB} MiB versions, window {WINDOW_MIB} MiB: peak extra MiB {busy}")
    # the window and as much again for room (measured 0-3 MiB extra); asking for all of it added 24-31 MiB
    assert max(peaks) < 2 * WINDOW_MIB * MiB, busy
