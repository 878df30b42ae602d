"""Simulated hosts with links of their own: one Linux network namespace per host, shaped veths on a bridge.

Why: N receiver processes on loopback share one machine's CPU, disk and "link" (loopback is a
memory copy), so no transfer design can look flat in N there. Real hosts each have a NIC of
their own; a namespace per host with a ``tbf``-shaped veth (each direction at ``mbit``) gives
each simulated host its own link of a set speed, so a benchmark measures what the fan-out
design does when the links, not this machine's two cores, are the bottleneck. The CPU is
still shared: pick a rate at which N hosts' processing fits in the cores (the benchmark prints
the load next to each row, so a CPU-bound row shows).

``cpu`` (cores, e.g. 0.2) also gives each host a CPU of its own: a cgroup whose CFS quota is that
share of a core, which every process started in the host (through :func:`prefix`) joins. Without
it, eight simulated hosts share two cores, and work that is per host on real machines (hashing,
writing 10,000 small files) adds up on this one; with it, each host's work runs at one host's
speed, in parallel with the others', as on real hosts (each slower than a real core; pick
``cpu * (n + 1)`` at or below the cores the machine has).

Needs root (CAP_NET_ADMIN), ``ip`` and ``tc`` (iproute2); ``cpu``: the cgroup ``cpu`` controller
(v1 ``/sys/fs/cgroup/cpu`` or v2). Hosts: ``"s"`` (the source) and ``0..n-1``; addresses
``10.78.0.1`` and ``10.78.0.(10+i)``.
"""

from __future__ import annotations

import os
import subprocess

BRIDGE = "rlwsbr"
SRC = "s"
_V1 = "/sys/fs/cgroup/cpu"
# v1's cpu hierarchy or v2; decided outside any namespace (inside one, sysfs has no cgroup mounts) and
# handed to the benchmark re-run inside the source's namespace in the environment
CGROOT = os.environ.get("RLWS_CGROOT") or (_V1 if os.path.exists(os.path.join(_V1, "cgroup.procs")) else "/sys/fs/cgroup")
os.environ["RLWS_CGROOT"] = CGROOT
_cpu_hosts: set[str] = set()  # hosts given a CPU share by up(): prefix() joins their cgroup


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


def cgroup(host: str | int) -> str:
    return os.path.join(CGROOT, ns_name(host))


def prefix(host: str | int) -> list[str]:
    """Argv prefix that runs a command inside ``host``'s namespace (and its CPU share, if it has one)."""
    out = ["ip", "netns", "exec", ns_name(host)]
    if str(host) in _cpu_hosts:  # joined first: `ip netns exec` mounts a sysfs of the namespace, without cgroups
        out = ["sh", "-c", f'echo $$ > {cgroup(host)}/cgroup.procs && exec "$@"', "_", *out]
    return out


def see_cgroups(hosts: list[str | int]) -> None:
    """Inside a namespace (``ip netns exec`` mounts a sysfs of its own, without the cgroup mounts):
    mount the ``cpu`` hierarchy again where :func:`cgroup` looks, in this mount namespace only,
    and let :func:`prefix` join the hosts' shares that :func:`up` made."""
    if not os.path.isdir(cgroup(SRC)):
        if CGROOT == _V1:
            subprocess.run(["mount", "-t", "tmpfs", "none", "/sys/fs/cgroup"], check=True)
            os.makedirs(_V1, exist_ok=True)
            subprocess.run(["mount", "-t", "cgroup", "-o", "cpu", "cgroup", _V1], check=True)
        else:
            subprocess.run(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"], check=True)
    _cpu_hosts.update(str(h) for h in hosts)


def _cpu_share(host: str | int, cores: float) -> None:
    path = cgroup(host)
    os.makedirs(path, exist_ok=True)
    quota = int(cores * 100_000)
    if CGROOT == _V1:
        with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
            f.write("100000")
        with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(quota))
    else:
        with open(os.path.join(path, "cpu.max"), "w") as f:
            f.write(f"{quota} 100000")
    _cpu_hosts.add(str(host))


def up(n: int, mbit: int, cpu: float = 0.0) -> None:
    """The source and ``n`` hosts, each behind its own veth shaped to ``mbit`` in both directions;
    ``cpu`` > 0: each with a CPU share of that many cores (see the module doc)."""
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
        if cpu:
            _cpu_share(host, cpu)


def down(n: int) -> None:
    """Remove what :func:`up` made (and what a killed run left); missing pieces are fine."""
    for host in [SRC, *range(max(n, 16))]:
        subprocess.run(["ip", "link", "del", f"rlws-{host}-b"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns_name(host)], capture_output=True)
        if os.path.isdir(cgroup(host)):
            try:
                os.rmdir(cgroup(host))  # its processes have ended (a live one keeps it: harmless)
            except OSError:
                pass
    _cpu_hosts.clear()
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
