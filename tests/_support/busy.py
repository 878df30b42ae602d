"""Busy loops that saturate the CPUs, for tests that check a guarantee on a loaded host."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def busy_loops(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run ``n`` interpreters that spin (``while True: pass``) for the ``with`` block; each is killed and
    reaped when the block ends, also when it raises."""
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield hogs
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()
