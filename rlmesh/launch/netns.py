"""Hosts that are really apart, on one machine: a Linux network namespace per host, on a veth bridge.

Why: procs on one machine talk over loopback or Unix sockets, so the paths that only matter
between machines (CurveZMQ off loopback, the workspace chain, TCP weight pulls, telemetry and the
debugger from another host, a host that drops off the network while its procs live on) never cross
a network interface with latency, loss or a bandwidth limit. Here each "host" is a namespace with
an address of its own on a bridge, a hostname of its own (a UTS namespace per proc start, so
same-host shortcuts such as shared-memory weights are not taken), and a link whose delay, loss and
rate are set by ``tc`` (``netem`` with a ``tbf`` under it; on a kernel without ``netem``, a delay
line of this module's own: ``HostNetwork(delay_line=True)``) and changed while procs run. Cutting a
host (:meth:`HostNetwork.cut`) takes its link down with its procs still running: a partition, not a
crash. The CPU, memory and file system are still this machine's.

When: tests (``tests/integration/netns/``), the shaped-link benchmarks, and
``rm.this_host(netns=hosts)`` (:class:`rlmesh.launch.local.LocalLauncher`), which starts a mesh's
procs inside the hosts. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), ``ip`` and ``tc`` (iproute2)
and ``unshare`` (util-linux).

Each :class:`HostNetwork` takes a ``/24`` of its own, ``10.80.K.0/24`` with ``K`` held by an
``flock`` on ``/run/rlmesh-netns/K.lock`` for the network's life, so two test modules (pytest-xdist
workers) or a test and a benchmark never collide, and never with other projects' bridges
(``10.78``, ``10.79``). The bridge itself holds ``10.80.K.1``: the controller's host, in the root
namespace. Names carry ``K`` (bridge ``rlnK``, namespaces ``rlnK-<host>``); a network a killed run
left behind is removed by the next one that takes the same ``K``.
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import logging
import os
import random
import selectors
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SUBNET_BASE = "10.80"
"""Networks are ``10.80.K.0/24``, K in 0..255 (benchmarks/workspace_sync uses 10.78, Slurm's nodes 10.79)."""
LOCK_DIR = "/run/rlmesh-netns"
CGROUP_V1 = "/sys/fs/cgroup/cpu"
WIRE_MTU = 64000
"""The MTU of a delay line's TAPs: a TAP takes no segmentation offload, so large frames keep the
frames per second (each crosses user space) low."""


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be made or changed (the ``ip``/``tc`` error is in the message)."""


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()} "
                         "(network namespaces need root: CAP_NET_ADMIN, and iproute2)")
    return out


@dataclass(frozen=True)
class Link:
    """How a host's link is shaped, each way: ``delay_ms`` one way (so the round trip to the bridge is
    twice it, and host to host four times), ``loss_pct`` of packets dropped, ``mbit`` the rate
    (0: unlimited)."""

    delay_ms: float = 0.0
    loss_pct: float = 0.0
    mbit: float = 0.0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "loss_pct", "mbit"):
            if getattr(self, name) < 0:
                raise ValueError(f"Link({name}={getattr(self, name)!r}): use a number >= 0")
        if self.loss_pct > 100:
            raise ValueError(f"Link(loss_pct={self.loss_pct!r}): a percentage, 0 to 100")


@dataclass(frozen=True)
class NetnsHost:
    """One simulated host: where its procs run (``netns``), the address they bind and are dialled at,
    the hostname they see, and the root-namespace end of its link (``link``), whose carrier says
    whether the host is reachable."""

    label: str
    netns: str
    address: str
    hostname: str
    link: str
    cgroup: str = ""  # a cgroup whose CPU quota its procs join ("" : none)

    def prefix(self) -> list[str]:
        """Argv prefix that runs a command on this host: in its network namespace, in a UTS namespace
        whose hostname is :attr:`hostname` (and in its CPU share, if it has one)."""
        join = f"echo $$ > {self.cgroup}/cgroup.procs && " if self.cgroup else ""
        # the cgroup is joined before `ip netns exec`, which mounts a sysfs of the namespace without cgroups
        return ["sh", "-c", f'{join}exec ip netns exec "$0" unshare --uts sh -c \'hostname "$0" && exec "$@"\' "$@"',
                self.netns, self.hostname]

    @property
    def inner_link(self) -> str:
        """The host's end of its link (inside :attr:`netns`)."""
        return self.link[:-1] + "h"

    def reachable(self) -> bool:
        """Whether the host's link is up (False while :meth:`HostNetwork.cut` holds it down)."""
        try:
            with open(f"/sys/class/net/{self.link}/carrier") as f:
                return f.read().strip() == "1"
        except OSError:  # down (carrier unreadable on a link that is down) or gone
            return False


class HostNetwork:
    """A bridge and ``n`` hosts on it; the controller's host is the bridge's own address, :attr:`address`.

    ``HostNetwork(3)`` builds at once; :meth:`close` (or ``with``) removes everything. ``link``
    shapes every host's link at first; :meth:`shape` changes one host's at any time. ``cpu`` > 0
    gives each host a CPU share of that many cores (a cgroup CFS quota), so per-host work runs side
    by side at one host's speed rather than adding up on this machine's cores. ``labels`` names the
    hosts (default ``"0".."n-1"``; at most 5 characters each: interface names have 15).

    ``delay_line``: links of TAP devices joined by a forwarding process of this module (one for all
    hosts) that holds each frame for the link's delay and drops its share of loss, instead of veths
    shaped by ``netem``. Why: a kernel without ``netem`` has no other way to delay a packet. The cost:
    the forwarder's CPU (every frame crosses user space; MTU 64,000, so a frame carries up to 64 KB)
    and its own wake-up latency, which adds to every delay; it runs at real-time priority
    (``SCHED_FIFO``, lowest level) so that a busy machine does not turn 0.05 ms into several ms.
    Rates are still ``tbf`` in the kernel.
    """

    def __init__(self, n: int = 0, link: Link | None = None, cpu: float = 0.0, labels: list[str] | None = None,
                 delay_line: bool = False):
        self.labels = list(labels) if labels is not None else [str(i) for i in range(n)]
        self.delay_line = delay_line
        self._wire: subprocess.Popen | None = None
        self._wire_fds: list[tuple[str, int, int]] = []  # (label, host end fd, bridge end fd) until handed over
        if any(len(x) > 5 or not x.replace("-", "").isalnum() for x in self.labels):
            raise ValueError(f"host labels {self.labels!r}: use up to 5 letters, digits or '-' each")
        self._lock_fd, self.k = self._take_subnet()
        self.bridge = f"rln{self.k}"
        self.address = f"{SUBNET_BASE}.{self.k}.1"
        self.hosts: list[NetnsHost] = []
        self._links: dict[str, Link] = {}
        self._cgroot = _cgroup_root() if cpu else ""
        try:
            self._remove(self.k)  # what a killed run with this K left behind
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.address}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for i, label in enumerate(self.labels):
                self.hosts.append(self._add_host(label, 10 + i, cpu))
            if delay_line:
                self._start_wire()
            for h in self.hosts:
                self.shape(h, link or Link())
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- building
    @staticmethod
    def _take_subnet() -> tuple[int, int]:
        os.makedirs(LOCK_DIR, exist_ok=True)
        for k in range(256):
            fd = os.open(os.path.join(LOCK_DIR, f"{k}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd, k
            except BlockingIOError:
                os.close(fd)
        raise NetnsError(f"all 256 subnets {SUBNET_BASE}.K.0/24 are taken (locks in {LOCK_DIR})")

    def _add_host(self, label: str, octet: int, cpu: float) -> NetnsHost:
        ns = f"rln{self.k}-{label}"
        here, there = ns + "b", ns + "h"  # the bridge's end, the host's end
        _run(["ip", "netns", "add", ns])
        if self.delay_line:
            fd_there, fd_here = _tap(there), _tap(here)
            self._wire_fds.append((label, fd_there, fd_here))
            for dev in (here, there):
                _run(["ip", "link", "set", dev, "mtu", str(WIRE_MTU)])
        else:
            _run(["ip", "link", "add", here, "type", "veth", "peer", "name", there])
        _run(["ip", "link", "set", there, "netns", ns])
        _run(["ip", "link", "set", here, "master", self.bridge])
        _run(["ip", "link", "set", here, "up"])
        addr = f"{SUBNET_BASE}.{self.k}.{octet}"
        _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", there])
        _run(["ip", "-n", ns, "link", "set", there, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        cg = ""
        if cpu:
            cg = os.path.join(self._cgroot, ns)
            _cpu_share(cg, cpu, self._cgroot)
        return NetnsHost(label, ns, addr, f"rlmesh-{label}", here, cg)

    def host(self, label: str | int) -> NetnsHost:
        """The host named ``label`` (an int: its index)."""
        if isinstance(label, int):
            return self.hosts[label]
        for h in self.hosts:
            if h.label == label:
                return h
        raise KeyError(f"no host {label!r}; the hosts are {self.labels}")

    # ---------------------------------------------------------------- shaping, cutting
    def shape(self, host: NetnsHost | str | int, link: Link) -> None:
        """Set ``host``'s link to ``link`` now (:func:`shape`; with a delay line, its delay and loss
        go to the forwarder and its rate to a ``tbf`` at each end)."""
        h = host if isinstance(host, NetnsHost) else self.host(host)
        if self._wire is not None:
            shape(h, Link(mbit=link.mbit))
            assert self._wire.stdin is not None
            self._wire.stdin.write(f"{h.label} {link.delay_ms / 1000:.9f} {link.loss_pct / 100:.6f}\n")
            self._wire.stdin.flush()
            if not self._wire_ack():
                raise NetnsError(f"the delay line did not take {h.label}'s new link (it exited)")
        else:
            shape(h, link)
        self._links[h.label] = link

    def _start_wire(self) -> None:
        """Start the forwarder with every host's two TAP fds (its own copies; ours are closed: the TAPs
        then live exactly as long as it does)."""
        specs = [f"{label}:{a}:{b}" for label, a, b in self._wire_fds]
        fds = [fd for _, a, b in self._wire_fds for fd in (a, b)]
        try:
            self._wire = subprocess.Popen([sys.executable, "-m", "rlmesh.launch.netns", "wire", *specs], pass_fds=fds,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        finally:
            for fd in fds:
                os.close(fd)
            self._wire_fds = []
        if not self._wire_ack():
            raise NetnsError("the delay line's forwarder did not start")

    def _wire_ack(self) -> bool:
        assert self._wire is not None and self._wire.stdout is not None
        return self._wire.stdout.readline().strip() == "ok"

    def link_of(self, host: NetnsHost | str | int) -> Link:
        """How ``host``'s link was last shaped."""
        h = host if isinstance(host, NetnsHost) else self.host(host)
        return self._links.get(h.label, Link())

    def cut(self, host: NetnsHost | str | int) -> None:
        """Take ``host``'s link down (:func:`cut`)."""
        cut(host if isinstance(host, NetnsHost) else self.host(host))

    def restore(self, host: NetnsHost | str | int) -> None:
        """Bring ``host``'s link back up (:func:`restore`)."""
        restore(host if isinstance(host, NetnsHost) else self.host(host))

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        """Remove the hosts and the bridge, and free the subnet; safe to call twice. Processes still
        running on a host are SIGKILLed (a test that failed half-way leaves none behind)."""
        if self._lock_fd < 0:
            return
        self._remove(self.k, [h.cgroup for h in self.hosts])
        for _, a, b in self._wire_fds:
            os.close(a)
            os.close(b)
        self._wire_fds = []
        if self._wire is not None:
            self._wire.kill()
            self._wire.wait()
            self._wire = None
        self.hosts = []
        os.close(self._lock_fd)
        self._lock_fd = -1

    @staticmethod
    def _remove(k: int, cgroups: list[str] | None = None) -> None:
        prefix = f"rln{k}-"
        names = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
        for ns in (line.split()[0] for line in names if line.strip()):
            if ns.startswith(prefix):
                for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                    try:  # a host that goes away takes its processes with it
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                _run(["ip", "link", "del", ns + "b"], check=False)
                _run(["ip", "netns", "del", ns], check=False)
        _run(["ip", "link", "del", f"rln{k}"], check=False)
        for cg in cgroups or ():
            if cg and os.path.isdir(cg):
                try:
                    os.rmdir(cg)  # a process still in it keeps it: harmless
                except OSError:
                    pass

    def __enter__(self) -> "HostNetwork":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shape(host: NetnsHost, link: Link) -> None:
    """Shape both ends of ``host``'s link to ``link`` now, replacing the rule before (its procs keep running)."""
    _qdisc(host.link, link, None)
    _qdisc(host.inner_link, link, host.netns)


def cut(host: NetnsHost) -> None:
    """Take ``host``'s link down, both ends: its procs live on, but nothing reaches them or leaves
    (a partition, not a crash). Usable from any process of this machine (root), by the host alone."""
    _run(["ip", "link", "set", host.link, "down"])
    _run(["ip", "-n", host.netns, "link", "set", host.inner_link, "down"])


def restore(host: NetnsHost) -> None:
    """Bring ``host``'s link back up (its shaping is kept)."""
    _run(["ip", "-n", host.netns, "link", "set", host.inner_link, "up"])
    _run(["ip", "link", "set", host.link, "up"])


def _qdisc(dev: str, link: Link, ns: str | None) -> None:
    """``dev``'s egress: a ``tbf`` at ``mbit``; with a delay or loss, ``netem`` at the root and the
    ``tbf`` under it.

    The token bucket's burst is at least 256 KiB (above one 64 KiB GSO packet, which would otherwise
    never fit and stall the link) and 2 ms of traffic at the rate; its queue holds 100 ms. A kernel
    built without ``netem`` (CONFIG_NET_SCH_NETEM; some VM kernels) still shapes rates and cuts
    links; asking it for a delay or a loss raises :class:`NetnsError` saying so."""
    tc = ["tc", *(["-n", ns] if ns else [])]
    _run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
    parent = ["root"]
    if link.delay_ms or link.loss_pct:
        netem = ["delay", f"{link.delay_ms}ms"] if link.delay_ms else []
        if link.loss_pct:
            netem += ["loss", f"{link.loss_pct}%"]
        # netem's own queue (1,000 packets by default) would drop at high rates: room for 100 ms at 10 Gbit/s
        out = _run([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "limit", "100000", *netem],
                   check=False)
        if out.returncode != 0:
            raise NetnsError(f"tc netem on {dev}: {out.stderr.strip()}; this kernel has no netem qdisc "
                             "(CONFIG_NET_SCH_NETEM), so links can be given a rate (Link(mbit=...)) and cut, "
                             "but no delay or loss: use Link(delay_ms=0, loss_pct=0) here")
        parent = ["parent", "1:1", "handle", "10:"]
    if link.mbit:
        burst = max(256 * 1024, int(link.mbit * 1e6 / 8 * 0.002))
        _run([*tc, "qdisc", "add", "dev", dev, *parent, "tbf", "rate", f"{link.mbit}mbit", "burst", str(burst),
              "latency", "100ms"])


def has_netem() -> bool:
    """Whether this kernel can delay and drop packets (``tc netem``): a dummy pair of veths is asked."""
    a, b = f"rlnq{os.getpid() % 100000}a", f"rlnq{os.getpid() % 100000}b"
    if _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=False).returncode != 0:
        return False
    try:
        return _run(["tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "1ms"], check=False).returncode == 0
    finally:
        _run(["ip", "link", "del", a], check=False)


def see_cgroups(hosts: list[NetnsHost]) -> None:
    """Let :meth:`NetnsHost.prefix` join the hosts' CPU shares from inside a host's namespace.

    Why: ``ip netns exec`` mounts a sysfs of the namespace's own, without the cgroup mounts, so a
    program re-run on a host (a benchmark that runs as its source host) would not find the shares
    :class:`HostNetwork` made. This mounts the CPU controller's hierarchy again where they live, in
    this process's mount namespace only. When: once, inside the namespace, before starting procs on
    the other hosts; nothing to do for hosts without a CPU share."""
    paths = [h.cgroup for h in hosts if h.cgroup]
    if not paths or os.path.isdir(paths[0]):
        return
    if paths[0].startswith(CGROUP_V1 + "/"):
        _run(["mount", "-t", "tmpfs", "none", "/sys/fs/cgroup"])
        os.makedirs(CGROUP_V1, exist_ok=True)
        _run(["mount", "-t", "cgroup", "-o", "cpu", "cgroup", CGROUP_V1])
    else:
        _run(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"])


def _cgroup_root() -> str:
    """Where CPU shares go: cgroup v1's ``cpu`` hierarchy, else the v2 root."""
    return CGROUP_V1 if os.path.exists(os.path.join(CGROUP_V1, "cgroup.procs")) else "/sys/fs/cgroup"


def _cpu_share(path: str, cores: float, root: str) -> None:
    os.makedirs(path, exist_ok=True)
    quota = int(cores * 100_000)
    if root == CGROUP_V1:
        with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
            f.write("100000")
        with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(quota))
    else:
        with open(os.path.join(path, "cpu.max"), "w") as f:
            f.write(f"{quota} 100000")


_TUNSETIFF, _IFF_TAP, _IFF_NO_PI = 0x400454CA, 0x0002, 0x1000


def _tap(name: str) -> int:
    """A TAP device ``name`` and the fd that is its wire (it exists while some process holds the fd)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    except OSError as exc:
        os.close(fd)
        raise NetnsError(f"could not make TAP device {name}: {exc} (needs root and /dev/net/tun)") from exc
    return fd


def _wire_main(specs: list[str]) -> None:
    """The delay line: for each host, frames read from one end of its link are written to the other
    ``delay`` seconds later, a ``loss`` share dropped. Per direction the frames keep their order (a
    FIFO; a delay made shorter waits behind the frames already held). Commands on stdin,
    ``<label> <delay s> <loss 0..1>``, each answered ``ok``."""
    sel = selectors.DefaultSelector()
    rule: dict[str, list[float]] = {}
    held: list[collections.deque] = []  # per direction: (due, out fd, frame)
    for spec in specs:
        label, a, b = spec.split(":")
        rule[label] = [0.0, 0.0]
        for src, dst in ((int(a), int(b)), (int(b), int(a))):
            q: collections.deque = collections.deque()
            held.append(q)
            sel.register(src, selectors.EVENT_READ, (label, dst, q))
    sel.register(sys.stdin, selectors.EVENT_READ, None)
    try:  # wake on time at any load: a normal process on a busy machine oversleeps a 0.05 ms timeout by ms
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (PermissionError, AttributeError, OSError):
        logger.warning("the delay line runs at normal priority: on a busy machine it adds its wake-up latency")
    timer = _Timer()  # epoll's own timeout is whole milliseconds: 4 crossings made a 0.2 ms round trip 4 ms
    sel.register(timer.fd, selectors.EVENT_READ, "timer")
    print("ok", flush=True)
    while True:
        timer.arm(min((q[0][0] for q in held if q), default=None))
        for key, _ in sel.select(None):
            if key.data == "timer":
                timer.clear()
                continue
            if key.data is None:
                line = sys.stdin.readline()
                if not line:
                    return  # our owner is gone
                label, delay, loss = line.split()
                rule[label] = [float(delay), float(loss)]
                print("ok", flush=True)
                continue
            label, dst, q = key.data
            delay, loss = rule[label]
            now = time.monotonic()
            for _ in range(256):
                try:
                    frame = os.read(key.fd, 65536)
                except BlockingIOError:
                    break
                except OSError:  # the link is down: nothing to read until it is back
                    break
                if loss and random.random() < loss:
                    continue
                if not delay and not q:
                    _send(dst, frame)
                else:
                    q.append((max(now + delay, q[-1][0] if q else 0.0), dst, frame))
        now = time.monotonic()
        for q in held:
            while q and q[0][0] <= now:
                _, dst, frame = q.popleft()
                _send(dst, frame)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Timer:
    """A ``timerfd`` on the monotonic clock (``time.monotonic``'s), armed at an absolute time with ns
    resolution: the delay line's wake-ups, where epoll's own timeout rounds up to a millisecond.
    (Python 3.11 has no ``os.timerfd_create``.)"""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")

    def arm(self, when: float | None) -> None:
        """Fire at monotonic time ``when`` (at once if it has passed); ``None`` disarms."""
        if when is None:
            spec = _Itimerspec()
        else:
            when = max(when, 1e-6)  # an all-zero value would disarm
            sec = int(when)
            spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((when - sec) * 1e9)))
        self._libc.timerfd_settime(self.fd, 1, ctypes.byref(spec), None)  # 1: TFD_TIMER_ABSTIME

    def clear(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass


def _send(fd: int, frame: bytes) -> None:
    try:
        os.write(fd, frame)
    except OSError:  # the other end is down or full: the frame is lost, as on a wire
        pass


if __name__ == "__main__" and sys.argv[1:2] == ["wire"]:
    _wire_main(sys.argv[2:])
