"""Workspace sync: rlmesh chain vs rsync (in turn, chained, in a tree, in parallel) vs a raw socket stream.

    PYTHONPATH=. python benchmarks/workspace_sync.py --big-mib 256 --files 10000 --n 1 4 8 --repeat 3
    PYTHONPATH=. python benchmarks/workspace_sync.py --smoke     # loopback, tiny trees, a few seconds

N hosts are simulated as N receiver processes (``python -m rlmesh.workspace.node``), each
with its own chunk store and destination, on loopback. "rlmesh" times from handing the
already started receivers their upstream addresses to the last one's tree materialised (the
manifest walk included, hashing every file as a new controller's first sync does, while the first
receiver already fetches the small files it has hashed, as ``sync_workspace`` does; Python start-up
not: a mesh's procs are running before a sync).
"rsync" is ``rsync -a`` (local mode, or to an ``rsync --daemon`` per receiver started before the
clock over shaped links) four ways: to each destination in turn ("seq"), along a chain (each
receiver from the one before, "chain"), in a binary tree (every receiver that has the tree sends
it on to a new one at each step, "tree"), and to all at once from the source ("par"). The best
of the four in each sample is the baseline of the ratio. Contenders run in an order that rotates
sample by sample. "raw" streams the
bytes over one TCP socket per receiver, in turn, into a file (a floor for one copy).
Each contender starts after an ``os.sync()`` (untimed), so none pays for the writeback of
the bytes the one before it wrote (the first sample used to, after ``make_trees``).
Last: a re-sync after a one-line edit in the small-file tree (warm store, N=1), target <= 0.5 s
on a 10,000-file tree; target (issue 40): rlmesh ahead of the best rsync on loopback and on links.

``--link-mbit R`` (root only; iproute2): each receiver, and the source, in a network namespace of
its own behind a veth shaped to R Mbit/s each way (``rlmesh.launch.netns``), so every simulated
host has a link of its own, as real hosts do. The chain then runs over CurveZMQ (off
loopback), rsync goes to an ``rsync --daemon`` in each receiver's namespace, and the raw
stream crosses the same links. On loopback all N "hosts" share one memory copy and two
cores, and the fan-out design cannot show; with links of their own it can, as long as N
hosts' processing at R fits in the cores (the load column says when it did not).

    sudo PYTHONPATH=. python benchmarks/workspace_sync.py --link-mbit 200 --big-mib 256 --work-dir /dev/shm
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from _common import Report, add_common_args, banner
from _rsync import RsyncHost, rsync_daemons

from rlmesh.launch.netns import HostNetwork, Link, NetnsHost, see_cgroups
from rlmesh.transport import Authenticator
from rlmesh.workspace import build_manifest
from rlmesh.workspace.manifest import forget_walks
from rlmesh.workspace.serve import ChunkServer, source_lookup

SRC = "s"  # the source's simulated host (the others are "0".."n-1")
HOSTS_ENV = "RLWS_HOSTS"  # the hosts, from the parent that built them to the run inside the source's namespace


def make_trees(base: str, big_mib: int, files: int, trees: tuple[str, ...] = ("big", "small")) -> tuple[str, str]:
    """The trees named in ``trees`` (a 1 GiB file written for a small-files run cost minutes at load)."""
    big, small = os.path.join(base, "big"), os.path.join(base, "small")
    os.makedirs(big)
    if "big" in trees:
        with open(os.path.join(big, "blob.bin"), "wb") as f:
            for _ in range(big_mib):
                f.write(os.urandom(1 << 20))
    for i in range(files if "small" in trees else 0):
        d = os.path.join(small, f"d{i // 100}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.py"), "w") as f:
            f.write(f"# module {i}\nVALUE = {i}\n" + "x = 1\n" * 20)
    return big, small


class Net:
    """Where each simulated host runs and which address it serves on: loopback (``mbit`` 0) or a network
    namespace of its own behind a shaped link (``rlmesh.launch.netns``; the benchmark itself then runs in
    the source's, host ``SRC``). The hosts come from the parent process, in ``HOSTS_ENV``."""

    def __init__(self, mbit: int):
        self.mbit = mbit
        self.hosts = {h["label"]: NetnsHost(**h) for h in json.loads(os.environ.get(HOSTS_ENV, "[]"))}

    def host(self, i: int | str) -> str:
        return self.hosts[str(i)].address if self.mbit else "127.0.0.1"

    def prefix(self, i: int) -> list[str]:
        return self.hosts[str(i)].prefix() if self.mbit else []


def rlmesh_sync(src: str, work: str, n: int, net: Net, transport: str | None = None,
                cold: bool = False) -> tuple[float, list[dict]]:
    """N receivers started and idle first (as the procs of a mesh are), then timed from handing out the
    chain's upstream addresses to the last tree materialised (the manifest walk included). ``cold``: the
    walk hashes every file, as a new controller process's first sync does (this process keeps the
    hashes of files unchanged since its last walk, which would spare every sample after the first)."""
    if cold:
        forget_walks()
    procs = [subprocess.Popen([*net.prefix(i), sys.executable, "-m", "rlmesh.workspace.node", "--upstream", "-",
                               "--store", os.path.join(work, f"store{i}"), "--dest", os.path.join(work, f"dest{i}"),
                               "--host", net.host(i), "--timeout", "600",
                               *(["--transport", transport] if transport else [])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(n)]
    addrs = [p.stdout.readline().strip() for p in procs]
    t0 = time.perf_counter()
    lookup = source_lookup(src)  # as sync_workspace: the server and the hosts first, then the walk (small files
    server = ChunkServer(None, lookup, host=net.host(SRC) if net.mbit else None, walking=True)  # travel as it goes)
    for p, up in zip(procs, [server.addr, *addrs[:-1]]):
        p.stdin.write(up + "\n")
        p.stdin.flush()
    m = lookup.manifest = build_manifest(src, held=lookup.held, on_hint=server.hint)
    server.publish(m.to_json())
    stats = [json.loads(p.stdout.readline()) for p in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.stdin.close()
        p.wait()
    server.close()
    bad = [s["error"] for s in stats if s.get("error")]
    if bad:
        raise RuntimeError(f"a receiver failed: {bad[0]}")
    return wall, stats


RSYNC_MODES = ("seq", "chain", "tree", "par")


def rsync_steps(n: int, mode: str) -> list[list[tuple[int | None, int]]]:
    """The transfers of each rsync layout as steps of (from, to) pairs run in parallel; from None = the source."""
    if mode == "seq":
        return [[(None, i)] for i in range(n)]
    if mode == "chain":
        return [[(None if i == 0 else i - 1, i)] for i in range(n)]
    if mode == "par":
        return [[(None, i) for i in range(n)]]
    steps, have, nxt = [], [None], 0  # tree: each holder sends to one new receiver per step
    while nxt < n:
        step = []
        for holder in list(have):
            if nxt < n:
                step.append((holder, nxt))
                have.append(nxt)
                nxt += 1
        steps.append(step)
    return steps


def rsync_fanout(src: str, work: str, n: int, net: Net, mode: str) -> float:
    """``rsync -a`` to N destinations laid out as ``mode`` (:func:`rsync_steps`): local mode on loopback;
    over the links, to an ``rsync --daemon`` in each receiver's namespace (started before the clock, as
    sshd would be), a receiver that passes the tree on running rsync from its own namespace."""
    def dest(i: int) -> str:  # a folder per layout: another layout's copy would make rsync's work a no-op
        return os.path.join(work, f"rsync-{mode}-{i}") + "/"

    def cmd(frm: int | None, to: int) -> list[str]:
        origin = src + "/" if frm is None else dest(frm)
        if not net.mbit:
            return ["rsync", "-a", origin, dest(to)]
        return [*([] if frm is None else net.prefix(frm)), "rsync", "-a", origin,
                f"rsync://{net.host(to)}:8730/ws/rsync-{mode}-{to}/"]

    hosts = [RsyncHost(net.prefix(i), net.host(i), work) for i in range(n if net.mbit else 0)]
    with rsync_daemons(hosts, work, 8730):
        t0 = time.perf_counter()
        for step in rsync_steps(n, mode):
            running = [subprocess.Popen(cmd(frm, to)) for frm, to in step]
            if any(p.wait() != 0 for p in running):
                raise RuntimeError(f"rsync ({mode}) failed")
        return time.perf_counter() - t0


def raw_seq(path: str, work: str, n: int, net: Net, tries: int = 3) -> float:
    """Each receiver in turn; a sample whose socket broke (seen once on a host at load 20) is taken again."""
    for _ in range(tries - 1):
        try:
            return _raw_seq(path, work, n, net)
        except OSError as exc:
            print(f"raw baseline sample failed ({exc}); again", file=sys.stderr)
    return _raw_seq(path, work, n, net)


def _raw_seq(path: str, work: str, n: int, net: Net) -> float:
    t0 = time.perf_counter()
    src = net.host(SRC)
    for i in range(n):
        srv = socket.create_server((src, 0))
        port = srv.getsockname()[1]
        rx = subprocess.Popen([*net.prefix(i), sys.executable, "-c", (
            "import socket,sys\ns=socket.create_connection((%r,%d))\nf=open(sys.argv[1],'wb')\n"
            "while b:=s.recv(1<<20): f.write(b)\n") % (src, port), os.path.join(work, f"raw{i}")])
        conn, _ = srv.accept()
        with open(path, "rb") as f:
            conn.sendfile(f)
        conn.close()
        rx.wait()
        srv.close()
    return time.perf_counter() - t0


def spread(xs: list[float]) -> str:
    """median [min-max] of repeated samples."""
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{xs[len(xs) // 2]:.2f} [{xs[0]:.2f}-{xs[-1]:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--repeat", type=int, default=3, help="samples per cell (median [min-max] printed)")
    ap.add_argument("--contenders", nargs="+", default=["rlmesh", "rsync", "raw"], choices=["rlmesh", "rsync", "raw"],
                    help="which to time (the sequential baselines to 8 slow links take 8x one's time)")
    ap.add_argument("--rsync", nargs="+", default=list(RSYNC_MODES), choices=RSYNC_MODES,
                    help="rsync layouts: in turn, chained, binary tree, all at once")
    ap.add_argument("--trees", nargs="*", default=["big", "small"], choices=["big", "small"])
    ap.add_argument("--transport", default=None, choices=["auto", "tcp", "rdma", "cma"],
                    help="how rlmesh's chunks cross each link (default: RLMESH_WORKSPACE_TRANSPORT, else auto: "
                         "RDMA where a device exists, TCP otherwise); cma: one-sided reads between processes on "
                         "this machine (loopback only)")
    ap.add_argument("--link-mbit", type=int, default=0,
                    help="give each simulated host (and the source) a network namespace of its own behind a link "
                         "shaped to this many Mbit/s each way (root; see rlmesh/launch/netns.py); 0: all on loopback")
    ap.add_argument("--host-cpu", type=float, default=0.0,
                    help="with --link-mbit: each simulated host (and the source) also gets a CPU share of this many "
                         "cores (a cgroup CFS quota), so per-host work runs in parallel at one host's speed, as on "
                         "real hosts, instead of N hosts' work adding up on this machine's cores")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)  # set when re-run in the source's
    ap.add_argument("--work-dir", default=None,
                    help="where the source tree, the receivers' stores and trees (and rsync's and raw's copies) go, "
                         "e.g. /dev/shm: memory as each simulated host's own disk, instead of one disk shared by all")
    add_common_args(ap)
    a = ap.parse_args()
    if a.smoke:  # loopback only: shaped links need root and network namespaces
        a.big_mib, a.files, a.n, a.repeat, a.link_mbit, a.host_cpu = 4, 300, [2], 1, 0, 0.0  # one sample: it runs, it prints
    os.environ.setdefault("RLMESH_SECRET", Authenticator.new_secret().hex())
    if a.host_cpu and not a.link_mbit:
        ap.error("--host-cpu needs --link-mbit (the CPU shares are per simulated host)")
    if a.link_mbit and not a.in_netns:  # build the hosts and their links, then run this inside the source's
        with HostNetwork(labels=[SRC, *map(str, range(max(a.n)))], link=Link(mbit=a.link_mbit), cpu=a.host_cpu) as hn:
            env = {**os.environ, HOSTS_ENV: json.dumps([dataclasses.asdict(h) for h in hn.hosts])}
            code = subprocess.call([*hn.host(SRC).prefix(), sys.executable, *sys.argv, "--in-netns"], env=env)
        sys.exit(code)
    if a.host_cpu:  # re-run inside the source's namespace: the hosts' shares were made by the parent
        see_cgroups(list(Net(a.link_mbit).hosts.values()))
    banner("workspace sync: rlmesh chain against rsync (seq, chain, tree, parallel) and a raw stream", "duckdb")
    report = Report("workspace_sync", smoke=a.smoke, args=vars(a))
    net = Net(a.link_mbit)
    where = f"links{a.link_mbit}" if a.link_mbit else "loopback"
    base = tempfile.mkdtemp(prefix="rlmesh-wsbench-", dir=a.work_dir)  # the source tree too: one file system for all
    try:
        big, small = make_trees(os.path.join(base, "src"), a.big_mib, a.files, tuple(a.trees))
        links = f"each host's link {a.link_mbit} Mbit/s each way (network namespaces)" if a.link_mbit else "loopback"
        if a.host_cpu:
            links += f", each host's CPU {a.host_cpu} of a core (cgroup quota)"
        print(f"big file {a.big_mib} MiB; {a.files} small files; {a.repeat} samples per cell, seconds median [min-max]; "
              f"receivers write to {a.work_dir or base}; {links}")
        rs_cols = [m for m in a.rsync if "rsync" in a.contenders]
        print(f"{'tree':>6} {'N':>3} {'rlmesh':>18} {'max host':>18} "
              + " ".join(f"{'rsync ' + m:>18}" for m in rs_cols) + f" {'raw seq':>18} {'load':>5}  rlmesh's transport")
        for name, src in [(t, big if t == "big" else small) for t in a.trees]:
            for n in a.n:
                walls, hosts, raws = [], [], []
                rss: dict[str, list[float]] = {m: [] for m in rs_cols}
                used: set[str] = set()
                contenders = ["rlmesh"] * ("rlmesh" in a.contenders) + [f"rsync-{m}" for m in rs_cols] + \
                    ["raw"] * ("raw" in a.contenders and name == "big")
                for k in range(a.repeat):
                    work = tempfile.mkdtemp(dir=a.work_dir or base, prefix="rlmesh-wsbench-")
                    try:
                        for c in contenders[k % len(contenders):] + contenders[: k % len(contenders)]:
                            if not a.smoke:  # a few MiB: not worth a sync of a shared machine's disks
                                os.sync()  # each contender starts with no dirty pages of the one before (or of make_trees)
                            if c == "rlmesh":
                                wall, stats = rlmesh_sync(src, work, n, net, a.transport, cold=True)
                                used.update(s["transport"] for s in stats)
                                walls.append(wall)
                                hosts.append(max(s["duration_s"] for s in stats))
                            elif c == "raw":
                                raws.append(raw_seq(os.path.join(big, "blob.bin"), work, n, net))
                            else:
                                rss[c.split("-", 1)[1]].append(rsync_fanout(src, work, n, net, c.split("-", 1)[1]))
                    finally:
                        shutil.rmtree(work, ignore_errors=True)  # a --work-dir in /dev/shm is memory
                print(f"{name:>6} {n:>3} {spread(walls):>18} {spread(hosts):>18} "
                      + " ".join(f"{spread(rss[m]):>18}" for m in rs_cols)
                      + f" {spread(raws):>18} {os.getloadavg()[0]:5.1f}  {'/'.join(sorted(used))}", flush=True)
                report.row(tree=name, n=n, where=where, rlmesh=walls, max_host=hosts, raw=raws,
                           **{f"rsync_{m}": rss[m] for m in rs_cols})
                if walls and rs_cols:
                    best = [min(rss[m][k] for m in rs_cols) for k in range(len(walls))]
                    r = report.ratio(f"{name}_n{n}_{where}_vs_best_rsync", [w / b for w, b in zip(walls, best)],
                                     "rlmesh s / best rsync s of the same sample")
                    report.target(f"{name}_n{n}_{where}_ahead_of_best_rsync", r.median, 1.0)
        if "rlmesh" not in a.contenders or "small" not in a.trees:
            report.write(a.json)
            return
        work = tempfile.mkdtemp(dir=base)
        rlmesh_sync(small, work, 1, net, a.transport)
        path = os.path.join(small, "d0", "f7.py")
        walls, hosts, cpus, src_cpus = [], [], [], []
        for i in range(a.repeat):
            with open(path, "a") as f:
                f.write(f"y = {i}\n")
            c0 = time.process_time()  # this process is the source: its walk and its server thread
            wall, stats = rlmesh_sync(small, work, 1, net, a.transport)
            src_cpus.append(time.process_time() - c0)
            walls.append(wall)
            hosts.append(stats[0]["duration_s"])
            cpus.append(stats[0]["cpu_s"])
        print(f"re-sync after a one-line edit: {spread(walls)} s wall (manifest walk included, receiver's Python start-up not), "
              f"host {spread(hosts)} s; CPU s: source {spread(src_cpus)}, host {spread(cpus)}; "
              f"{stats[0]['bytes_received']} bytes in {stats[0]['chunks_received']} chunk(s), "
              f"file size {os.path.getsize(path)}; load {os.getloadavg()[0]:.1f}")
        report.row(figure="re-sync after a one-line edit", files=a.files, seconds=walls, host_cpu_s=cpus,
                   source_cpu_s=src_cpus)
        report.target(f"resync_one_line_edit_{a.files}_files", sorted(walls)[len(walls) // 2], 0.5, unit="s",
                      note="the target is for 10,000 files" if a.files != 10000 else "")
        report.write(a.json)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
