"""Cross-host paths between simulated hosts on shaped links: call_one, weight pulls, workspace sync.

    sudo PYTHONPATH=. .venv/bin/python benchmarks/shaped_links.py --json shaped_links.json   # ~10 min quiet
    sudo PYTHONPATH=. .venv/bin/python benchmarks/shaped_links.py --smoke                     # a few seconds

Each host is a network namespace on a bridge (:mod:`rlmesh.launch.netns`) whose link is shaped by
``tc`` to 1 and 10 Gbit/s each way (``tbf``), at the link's own round trip and at 0.2, 2 and 20 ms
between two hosts (a quarter of it on each end of each host's link; the controller's host is the
bridge itself, so a call from it crosses one host link: half the RTT). The delay is ``netem``'s
where the kernel has it, else the delay line's (``HostNetwork(delay_line=True)``: TAP links through
a forwarding process, whose own latency and CPU add to every figure: the 'measured' column is a
UDP echo's round trip host to host).
This process is the controller, listening on the bridge; its ``far`` mesh has one proc per host.
Per cell, interleaved round by round with its baseline:

- ``call_one`` to an actor on host 0 against the same call to a proc on the controller's own host
  (same CurveZMQ on the bridge address, no link): what the namespace, veth and shaping add;
- one weight version (``--weights-mib``) pulled over TCP by the proc on host 1, and by the procs on
  hosts 1..N-1 at once (the publisher's link is shared: a fan-out's real bottleneck), against a raw
  TCP stream of the same bytes from host 0 to host 1; plus the publisher's CPU seconds per GB it
  served (CurveZMQ encrypts every byte), the per-host cost a 1,000-host fan-out multiplies;
- ``sync_workspace`` of a tree (one big file and many small ones) to every host along rlmesh's
  chain, against ``rsync`` chained host to host (each host pulls from the one before, from an
  ``rsync --daemon`` started before the clock): both write to ``/dev/shm``.

Only the links are apart: every host still shares this machine's two cores, so the 10 Gbit/s
rows show where CPU (encryption, copies, Python) rather than the link bounds a path; the load
column says how busy the machine was.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, interleave, load  # noqa: E402
from _rsync import RsyncHost, rsync_daemons  # noqa: E402

from rlmesh import settings  # noqa: E402
from rlmesh.launch.netns import HostNetwork, Link, has_netem  # noqa: E402
from rlmesh.workspace import sync_workspace  # noqa: E402

RSYNC_PORT = 8731


def _rtt_link(mbit: float, rtt_ms: float) -> Link:
    """A host link at ``mbit`` whose two ends together add ``rtt_ms / 2`` each way: host to host, ``rtt_ms``."""
    return Link(delay_ms=rtt_ms / 4, mbit=mbit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--gbit", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0.2, 2.0, 20.0],
                    help="round trips host to host (needs netem; without it, only the veth's own)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=500, help="call_one round trips per round and side")
    ap.add_argument("--weights-mib", type=int, default=256)
    ap.add_argument("--tree-mib", type=int, default=128)
    ap.add_argument("--tree-files", type=int, default=2000)
    add_common_args(ap)
    a = ap.parse_args()
    if a.smoke:
        a.hosts, a.gbit, a.rtt_ms, a.rounds, a.calls = 2, [1.0], [], 1, 50
        a.weights_mib, a.tree_mib, a.tree_files = 4, 2, 20
    report = Report("shaped links: call_one, weight pulls, workspace sync between network-namespace hosts",
                    smoke=a.smoke, args=vars(a))
    banner(report.title, "torch")
    netem = has_netem()
    rtts: list[float | None] = [None, *a.rtt_ms]
    print(f"# delay: {'netem' if netem else 'the delay line (this kernel has no netem): TAP links through a forwarding process'}"
          f"; rates: tbf. The RTT column is the target host to host, 'base' none added; 'measured' a UDP echo's")
    # the hosts' procs quit after this much silence from their controller, which shares this machine's
    # cores with them: at load 45-50 one heard nothing for 16 s and quit (default 10 s)
    os.environ.setdefault(settings.CONTROLLER_TIMEOUT_S.name, "120")
    with HostNetwork(a.hosts, delay_line=not netem) as net:
        os.environ[settings.BIND_HOST.name] = net.address  # the controller listens on the bridge
        run(a, net, rtts, report)
    report.write(a.json)


def run(a: argparse.Namespace, net: HostNetwork, rtts: list[float | None], report: Report) -> None:
    import rlmesh as rm  # deferred: the controller starts only once RLMESH_BIND_HOST names the bridge

    from bench_shaped_actors import Peer  # a module of its own: the hosts' procs import it by name

    t0 = time.perf_counter()
    far = rm.this_host(netns=net.hosts).spawn_procs(per_host={"procs": a.hosts}, name="far")
    peers = far.spawn("peer", Peer)
    peers.ping.call().get()
    startup = time.perf_counter() - t0
    near = rm.this_host().spawn_procs(per_host={"procs": 1}, name="near").spawn("near", Peer)
    print(f"# {a.hosts} hosts: start-up of one proc on each (a fresh Python per host, spawn, first call) "
          f"{startup:.2f} s")
    report.row(kind="startup", hosts=a.hosts, seconds=startup)
    pub_pid = far._records()[0].pid
    work = tempfile.mkdtemp(prefix="rlmesh-shaped-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    src = make_tree(os.path.join(work, "src"), a.tree_mib, a.tree_files)
    version = 0
    print(f"{'Gbit/s':>6} {'RTT ms':>6} {'measured':>8} | {'call_one far/near µs':>21} {'x':>5} | {'pull 1 s':>8} {'raw s':>6} {'x':>5} "
          f"{'pull N-1 s':>10} {'pub CPU s/GB':>12} | {'ws rlmesh s':>11} {'rsync chain s':>13} {'x':>5} | load")
    try:
        for gbit in a.gbit:
            for rtt in rtts:
                for h in net.hosts:
                    net.shape(h, _rtt_link(gbit * 1000, rtt) if rtt is not None else Link(mbit=gbit * 1000))
                row = cell(a, net, far, peers, near, pub_pid, src, work, version, report, gbit, rtt)
                version = row.pop("version")
                report.row(kind="cell", gbit=gbit, rtt_ms=rtt, **row)
                print(f"{gbit:>6g} {('base' if rtt is None else f'{rtt:g}'):>6} {row['rtt_measured_ms']:>8.2f} | "
                      f"{row['call_far_us']:>10.0f}/{row['call_near_us']:<10.0f} {row['call_ratio']:>5.2f} | "
                      f"{row['pull1_s']:>8.3f} {row['raw_s']:>6.3f} {row['pull_ratio']:>5.2f} {row['pull_all_s']:>10.3f} "
                      f"{row['pub_cpu_s_per_gb']:>12.2f} | {row['ws_s']:>11.3f} {row['rsync_s']:>13.3f} "
                      f"{row['ws_ratio']:>5.2f} | {load():.1f}", flush=True)
    finally:
        far.stop()  # before the hosts go (HostNetwork.close SIGKILLs what still runs on them)
        shutil.rmtree(work, ignore_errors=True)


def cell(a: argparse.Namespace, net: HostNetwork, far, peers, near, pub_pid: int, src: str, work: str, version: int,
         report: Report, gbit: float, rtt: float | None) -> dict:
    name = f"{gbit:g} Gbit/s, {'base RTT' if rtt is None else f'{rtt:g} ms RTT'}"
    far0 = peers.slice(procs=0)
    n_calls = a.calls if not rtt else max(20, min(a.calls, int(1000 / rtt)))  # about a second a side at 20 ms
    rtt_measured = udp_rtt(net)

    def calls(actor) -> float:
        actor.ping.call_one().get()
        ts = []
        for _ in range(n_calls):
            t = time.perf_counter()
            actor.ping.call_one().get()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    near_us, far_us = interleave(a.rounds, lambda: calls(near) * 1e6, lambda: calls(far0) * 1e6)
    call = report.ratio(f"call_one far/near, {name}", [f / n for f, n in zip(far_us, near_us)])

    readers = list(range(1, a.hosts))
    pull_all, cpu_per_gb = [], []

    def one_pull() -> float:
        nonlocal version
        version += 1
        peers.slice(procs=0).publish.call_one(a.weights_mib, version).get()
        return peers.slice(procs=1).pull.call_one(version).get()

    def raw() -> float:
        return raw_stream(net, a.weights_mib << 20)

    raws, pulls = interleave(a.rounds, raw, one_pull)
    pull = report.ratio(f"weight pull over TCP / raw TCP stream, {a.weights_mib} MiB, {name}",
                        [p / r for p, r in zip(pulls, raws)])
    for _ in range(a.rounds):
        version += 1
        peers.slice(procs=0).publish.call_one(a.weights_mib, version).get()
        before = _cpu(pub_pid)
        t = time.perf_counter()
        futs = [peers.slice(procs=r).pull.call_one(version) for r in readers]
        for f in futs:
            f.get(timeout=600)
        pull_all.append(time.perf_counter() - t)
        cpu_per_gb.append((_cpu(pub_pid) - before) / (len(readers) * a.weights_mib / 1024))

    rounds = iter(range(10**6))

    def ws() -> float:
        d = os.path.join(work, f"ws{next(rounds)}")
        t = time.perf_counter()
        rows = sync_workspace(far, src, store_dir=os.path.join(d, "stores"),
                              dest_root=os.path.join(d, "hosts"), simulate_hosts=True, editable=False, timeout=600)
        took = time.perf_counter() - t
        assert all(not r.stats.error for r in rows), [r.stats.error for r in rows]
        shutil.rmtree(d, ignore_errors=True)
        return took

    def rs() -> float:
        d = os.path.join(work, f"rs{next(rounds)}")
        took = rsync_chain(net, src, d)
        shutil.rmtree(d, ignore_errors=True)
        return took

    rsyncs, wss = interleave(a.rounds, rs, ws)
    wsr = report.ratio(f"workspace sync rlmesh chain / rsync chain, {len(net.hosts)} hosts, {name}",
                       [w / r for w, r in zip(wss, rsyncs)])
    return {"version": version, "rtt_measured_ms": rtt_measured * 1000, "call_far_us": statistics.median(far_us), "call_near_us": statistics.median(near_us),
            "call_ratio": call.median, "pull1_s": statistics.median(pulls), "raw_s": statistics.median(raws),
            "pull_ratio": pull.median, "pull_all_s": statistics.median(pull_all),
            "pub_cpu_s_per_gb": statistics.median(cpu_per_gb), "ws_s": statistics.median(wss),
            "rsync_s": statistics.median(rsyncs), "ws_ratio": wsr.median, "load": load()}


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_tree(root: str, big_mib: int, files: int) -> str:
    os.makedirs(os.path.join(root, "data"))
    with open(os.path.join(root, "data", "blob.bin"), "wb") as f:
        for _ in range(big_mib):
            f.write(os.urandom(1 << 20))
    for i in range(files):
        d = os.path.join(root, "pkg", f"m{i // 100}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.py"), "w") as f:
            f.write(f"VALUE = {i}\n" + "x = 1\n" * 20)
    return root


def raw_stream(net: HostNetwork, nbytes: int) -> float:
    """Seconds for ``nbytes`` over one plain TCP connection from host 0 to host 1, timed by the receiver
    from its connect to the sender's close (both Pythons started before the clock)."""
    a, b = net.hosts[0], net.hosts[1]
    sender = subprocess.Popen([*a.prefix(), sys.executable, "-c", (
        "import socket,sys\ns=socket.create_server((sys.argv[1],0))\nprint(s.getsockname()[1],flush=True)\n"
        "c,_=s.accept()\nbuf=bytearray(1<<20)\nleft=int(sys.argv[2])\n"
        "while left>0:\n n=min(left,len(buf)); c.sendall(memoryview(buf)[:n]); left-=n\nc.close()\n"),
        a.address, str(nbytes)], stdout=subprocess.PIPE, text=True)
    port = sender.stdout.readline().strip()
    out = subprocess.run([*b.prefix(), sys.executable, "-c", (
        "import socket,sys,time\nt=time.perf_counter()\ns=socket.create_connection((sys.argv[1],int(sys.argv[2])))\n"
        "buf=bytearray(1<<20)\nn=0\nwhile (k:=s.recv_into(buf)): n+=k\nprint(time.perf_counter()-t, n)\n"),
        a.address, port], capture_output=True, text=True, check=True)
    sender.wait()
    took, got = out.stdout.split()
    assert int(got) == nbytes, (got, nbytes)
    return float(took)


def udp_rtt(net: HostNetwork, n: int = 20) -> float:
    """Median seconds of a UDP echo from host 1 to host 0: the links' round trip as shaped (with
    the delay line's own latency, where it is the delay)."""
    a, b = net.hosts[0], net.hosts[1]
    echo = subprocess.Popen([*a.prefix(), sys.executable, "-c", (
        "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind((sys.argv[1],0))\n"
        "print(s.getsockname()[1],flush=True)\nwhile 1:\n d,p=s.recvfrom(100)\n s.sendto(d,p)\n"), a.address],
        stdout=subprocess.PIPE, text=True)
    try:
        port = echo.stdout.readline().strip()
        out = subprocess.run([*b.prefix(), sys.executable, "-c", (
            "import socket,sys,time,statistics\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.settimeout(5)\n"
            "ts=[]\nfor i in range(int(sys.argv[3])):\n t=time.perf_counter(); s.sendto(b'x',(sys.argv[1],int(sys.argv[2])))\n"
            " s.recv(10); ts.append(time.perf_counter()-t)\nprint(statistics.median(ts))\n"), a.address, port, str(n)],
            capture_output=True, text=True, check=True)
        return float(out.stdout)
    finally:
        echo.kill()
        echo.wait()


def rsync_chain(net: HostNetwork, src: str, work: str) -> float:
    """``rsync -a`` along the chain: the source pushes to host 0's daemon, then each host pulls from
    the one before it (its daemon serves what it received). Daemons start before the clock."""
    dests = [os.path.join(work, f"host{i}") for i in range(len(net.hosts))]
    for d in dests:
        os.makedirs(d)
    with rsync_daemons([RsyncHost(h.prefix(), h.address, d) for h, d in zip(net.hosts, dests)], work, RSYNC_PORT):
        t0 = time.perf_counter()
        subprocess.run(["rsync", "-a", src + "/", f"rsync://{net.hosts[0].address}:{RSYNC_PORT}/ws/"], check=True)
        for i in range(1, len(net.hosts)):
            subprocess.run([*net.hosts[i].prefix(), "rsync", "-a",
                            f"rsync://{net.hosts[i - 1].address}:{RSYNC_PORT}/ws/", dests[i] + "/"], check=True)
        return time.perf_counter() - t0


if __name__ == "__main__":
    main()
