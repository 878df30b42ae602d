"""Checks on OS processes shared by the lifecycle and fork-server tests: is a pid gone, wait until all are."""

import time

import psutil


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids, timeout: float = 10.0) -> None:
    """Fail the test unless every pid in ``pids`` is gone within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not all(gone(p) for p in pids):
        assert time.monotonic() < deadline, f"procs still alive: {[p for p in pids if not gone(p)]}"
        time.sleep(0.05)
