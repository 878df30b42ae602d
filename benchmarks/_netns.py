"""Simulated hosts with links of their own: one Linux network namespace per host, shaped veths on a bridge.

Why: N receiver processes on loopback share one machine's CPU, disk and "link" (loopback is a
memory copy), so no transfer design can look flat in N there. Real hosts each have a NIC of
their own; a namespace per host with a ``tbf``-shaped veth (each direction at ``mbit``) gives
each simulated host its own link of a set speed, so a benchmark measures what the fan-out
design does when the links, not this machine's two cores, are the bottleneck. The CPU is
still shared: pick a rate at which N hosts' processing fits in the cores (the benchmark prints
the load next to each row, so a CPU-bound row shows).

Needs root (CAP_NET_ADMIN), ``ip`` and ``tc`` (iproute2). Hosts: ``"s"`` (the source) and
``0..n-1``; addresses ``10.78.0.1`` and ``10.78.0.(10+i)``.
"""

from __future__ import annotations

import subprocess

BRIDGE = "rlwsbr"
SRC = "s"


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True)


def _shape(dev: str, mbit: int, ns: str | None = None) -> None:
    """Egress of ``dev`` at ``mbit``: a token bucket with a burst above one GSO packet (64 KiB), or
    a TSO-sized packet would never fit and the link would stall."""
    cmd = [*(["ip", "netns", "exec", ns] if ns else []), "tc", "qdisc", "add", "dev", dev, "root", "tbf",
           "rate", f"{mbit}mbit", "burst", "256kb", "latency", "100ms"]
    subprocess.run(cmd, check=True, capture_output=True)


def ns_name(host: str | int) -> str:
    return f"rlws-{host}"


def address(host: str | int) -> str:
    return "10.78.0.1" if host == SRC else f"10.78.0.{10 + int(host)}"


def prefix(host: str | int) -> list[str]:
    """Argv prefix that runs a command inside ``host``'s namespace."""
    return ["ip", "netns", "exec", ns_name(host)]


def up(n: int, mbit: int) -> None:
    """The source and ``n`` hosts, each behind its own veth shaped to ``mbit`` in both directions."""
    down(n)
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("link", "set", BRIDGE, "up")
    for host in [SRC, *range(n)]:
        ns, h, b = ns_name(host), f"rlws-{host}-h", f"rlws-{host}-b"
        _ip("netns", "add", ns)
        _ip("link", "add", b, "type", "veth", "peer", "name", h)
        _ip("link", "set", h, "netns", ns)
        _ip("link", "set", b, "master", BRIDGE)
        _ip("link", "set", b, "up")
        _ip("addr", "add", f"{address(host)}/24", "dev", h, ns=ns)
        _ip("link", "set", h, "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        _shape(b, mbit)  # the host's download: what the bridge sends it
        _shape(h, mbit, ns)  # its upload


def down(n: int) -> None:
    """Remove what :func:`up` made (and what a killed run left); missing pieces are fine."""
    for host in [SRC, *range(max(n, 16))]:
        subprocess.run(["ip", "link", "del", f"rlws-{host}-b"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns_name(host)], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
