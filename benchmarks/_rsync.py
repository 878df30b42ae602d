"""The rsync baseline's servers, shared by ``workspace_sync.py`` and ``shaped_links.py``: an ``rsync --daemon``
in each simulated host's network namespace, started and listening before the clock (as sshd would be on a
real host), stopped after it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple


class RsyncHost(NamedTuple):
    prefix: list[str]  # the command prefix that runs a program in the host's namespace ([] for this one)
    address: str  # the address its daemon listens on
    path: str  # the folder its module ``ws`` serves, read-write


@contextmanager
def rsync_daemons(hosts: Sequence[RsyncHost], conf_dir: str, port: int) -> Iterator[None]:
    """One ``rsync --daemon`` per host on ``address:port``, serving ``rsync://address:port/ws/``; the block
    runs once every daemon accepts connections, and the daemons are stopped when it ends. Their
    configurations are ``rsyncd<i>.conf`` in ``conf_dir``."""
    daemons = []
    try:
        for i, h in enumerate(hosts):
            conf = os.path.join(conf_dir, f"rsyncd{i}.conf")
            with open(conf, "w") as f:
                f.write(f"[ws]\npath = {h.path}\nread only = false\nuse chroot = false\nuid = 0\ngid = 0\n")
            daemons.append(subprocess.Popen([*h.prefix, "rsync", "--daemon", "--no-detach", f"--config={conf}",
                                             f"--address={h.address}", f"--port={port}"]))
        for h in hosts:
            _wait_port(h.address, port)
        yield
    finally:
        for d in daemons:
            d.terminate()
            d.wait()


def _wait_port(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
