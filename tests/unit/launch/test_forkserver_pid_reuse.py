"""The fork server's exit table is keyed by request id: a pid reused by a later child (a long
run forks thousands of procs and pids wrap) must not make that child look dead at once.

Before: exits were keyed by pid; after the wrap, every relaunch whose pid had been used before
was reported dead immediately and its process was left running, unknown to the controller."""

import threading

from rlmesh.launch.forkserver import ForkedProcHandle, ForkServer


def table() -> ForkServer:
    srv = ForkServer.__new__(ForkServer)  # the bookkeeping only: no process behind it
    srv.name, srv.on_exit, srv.dead = "t", None, False
    srv.ready = threading.Event()
    srv._pids, srv._errors, srv._status, srv._kill_on_fork = {}, {}, {}, set()
    return srv


def test_a_reused_pid_does_not_inherit_an_earlier_childs_exit():
    srv = table()
    first, second = ForkedProcHandle(srv, 1), ForkedProcHandle(srv, 2)
    srv._on_message({"id": 1, "pid": 4242})
    srv._on_message({"exit": 4242, "id": 1, "code": None, "signal": 9})
    assert first.poll() == (None, 9) and first.local_pid is None
    srv._on_message({"id": 2, "pid": 4242})                 # the same pid, a new process
    assert second.poll() is None and second.local_pid == 4242
    srv._on_message({"exit": 4242, "id": 2, "code": 0, "signal": None})
    assert second.poll() == (0, None) and first.poll() == (None, 9)
