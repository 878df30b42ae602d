"""CPU per round trip, per side and per thread: ``call_one`` against raw pyzmq, both measured in one run.

    python benchmarks/call_cpu.py [--calls 20000] [--rounds 3] [--pin same|split]

Why this script: a latency ratio on a VM swings with where the scheduler puts the two ends
(``actor_latency_paired.py`` shows the modes), so it cannot tell whether a change to the call path
made it cheaper. CPU time per call can: each thread's user and system time is read from
``/proc/<pid>/task/<tid>/stat`` before and after a block of calls, and divided by the calls. The
caller's and the server's main threads are where rlmesh's Python runs; their libzmq I/O threads do
the same work as raw zmq's. Raw zmq is measured the same way in the same run: a DEALER in this
process's main thread against a ROUTER in a process of its own (``actor_latency.py``'s server), over
loopback TCP and, on Linux, over an abstract Unix socket: the transport rlmesh's data plane uses
between local procs (``RLMESH_LOCAL_TRANSPORT``, default ``ipc`` on Linux). The ratio that compares
like with like is against the raw floor on rlmesh's own transport; both are printed.

``--pin same`` (the default) puts every thread of both ends on CPU 0, so the wall time of a round
trip is the CPU work of both ends, with no idle core to wake; ``split`` puts the callers on CPU 0
and the servers on CPU 1. The per-call numbers are clock ticks summed over ``--calls`` calls
(``SC_CLK_TCK``, 100 Hz: 10 ms granularity over 2-4 s of work per block, so about ±0.5 µs).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner  # noqa: E402
from actor_latency import _zmq_server  # noqa: E402  (the raw ROUTER server the latency scripts use)
from actor_latency_paired import _pinned, echo_actor, pin_process  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """``{tid: (name, user s, system s)}`` for every thread of ``pid`` now."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(tid)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[11]) / TICK, int(fields[12]) / TICK)
    return out


def per_call(pid: int, before: dict, after: dict, calls: int) -> tuple[float, float]:
    """(main thread, all other threads) CPU µs per call of process ``pid`` between two snapshots."""
    main = other = 0.0
    for tid, (_, u, s) in after.items():
        if tid in before:
            d = (u - before[tid][1] + s - before[tid][2]) / calls * 1e6
            if tid == pid:
                main += d
            else:
                other += d
    return main, other


def measure(calls: int, fn, server_pid: int) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """Wall µs per call, (main, others) CPU µs per call of this process, and of the server."""
    me = os.getpid()
    c0, s0, t0 = thread_cpu(me), thread_cpu(server_pid), time.perf_counter()
    for _ in range(calls):
        fn()
    t1, c1, s1 = time.perf_counter(), thread_cpu(me), thread_cpu(server_pid)
    return (t1 - t0) / calls * 1e6, per_call(me, c0, c1, calls), per_call(server_pid, s0, s1, calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000, help="round trips per block")
    ap.add_argument("--rounds", type=int, default=3, help="raw-then-rlmesh blocks")
    ap.add_argument("--pin", choices=("same", "split"), default="same",
                    help="same: both ends on CPU 0; split: callers on CPU 0, servers on CPU 1")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.calls, args.rounds = 2000, 2  # CPU times come in 10 ms ticks: fewer calls read as 0
    report = Report("call_cpu", smoke=args.smoke, args=vars(args))
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        raise SystemExit("needs Linux (/proc and os.sched_setaffinity)")
    if args.pin == "split" and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--pin split needs two CPUs")
    banner(f"CPU per round trip: call_one vs raw pyzmq ({args.rounds} rounds of {args.calls}, pin {args.pin})")
    server_cpus = {0} if args.pin == "same" else {1}
    os.sched_setaffinity(0, {0})  # before rlmesh starts a thread: they all inherit it

    import zmq

    import rlmesh as rm
    from rlmesh.transport.sockets import local_transport

    Echo = echo_actor()
    spawn = mp.get_context("spawn")
    # The raw floor over both transports: loopback TCP (the historical baseline) and, on Linux, the
    # abstract Unix sockets that rlmesh's data plane uses between local procs by default.
    transports = ["tcp", "ipc"] if sys.platform.startswith("linux") else ["tcp"]
    raw_servers, raw_socks, raw_fns = {}, {}, {}
    for t in transports:
        addr_q = spawn.Queue()
        raw_servers[t] = spawn.Process(target=_pinned, args=(server_cpus, _zmq_server, addr_q, None, t), daemon=True)
        raw_servers[t].start()
        sock = raw_socks[t] = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(addr_q.get(timeout=60))

        def raw_rtt(sock=sock) -> None:
            sock.send(b"ping")
            sock.recv()

        raw_fns[t] = raw_rtt
    print(f"# rlmesh's data plane between local procs: {local_transport()} (RLMESH_LOCAL_TRANSPORT)")

    header = (f"{'round':>5} {'what':<9}{'wall':>9}{'caller main':>13}{'caller rest':>13}"
              f"{'server main':>13}{'server rest':>13}   (µs per call)")
    rows: dict[str, list[tuple]] = {**{f"raw {t}": [] for t in transports}, "call_one": []}
    try:
        with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
            echo = procs.spawn("echo", Echo)
            worker_pid = echo.pid.call().get(timeout=60)[0]
            pin_process(worker_pid, server_cpus)
            one = echo.slice(procs=0)
            for _ in range(200 if args.smoke else 2000):  # warm both ends
                for fn in raw_fns.values():
                    fn()
                one.ping.call_one().get()
            print(header)
            blocks = [(f"raw {t}", raw_fns[t], raw_servers[t].pid) for t in transports]
            blocks.append(("call_one", lambda: one.ping.call_one().get(), worker_pid))
            for r in range(1, args.rounds + 1):
                k = (r - 1) % len(blocks)  # the order rotates round by round
                for what, fn, pid in blocks[k:] + blocks[:k]:
                    wall, (cm, co), (sm, so) = measure(args.calls, fn, pid)
                    rows[what].append((wall, cm, co, sm, so))
                    print(f"{r:>5} {what:<9}{wall:>9.1f}{cm:>13.1f}{co:>13.1f}{sm:>13.1f}{so:>13.1f}", flush=True)
    finally:
        for t, srv in raw_servers.items():
            raw_socks[t].send(b"quit")
            srv.join(10)
    lo_hi = {w: [(min(c), max(c)) for c in zip(*rs)] for w, rs in rows.items()}
    ow, ocm, _, osm, _ = lo_hi["call_one"]
    print(f"\ncall_one: wall {ow[0]:.1f}-{ow[1]:.1f} µs, main threads (caller + server) "
          f"{ocm[0] + osm[0]:.1f}-{ocm[1] + osm[1]:.1f} µs of CPU per call")
    for t in transports:
        rw, rcm, _, rsm, _ = lo_hi[f"raw {t}"]
        ratio = sorted(o[0] / w[0] for o, w in zip(rows["call_one"], rows[f"raw {t}"]))
        print(f"raw {t}: wall {rw[0]:.1f}-{rw[1]:.1f} µs, main threads {rcm[0] + rsm[0]:.1f}-{rcm[1] + rsm[1]:.1f} µs; "
              f"call_one / raw {t}, per round: {ratio[0]:.2f}-{ratio[-1]:.2f}x")
        report.ratio(f"call_one_wall_vs_raw_{t}_pin_{args.pin}", ratio, "rlmesh wall µs / raw wall µs")
        cpu = [(o[1] + o[3]) / (w[1] + w[3]) for o, w in zip(rows["call_one"], rows[f"raw {t}"]) if w[1] + w[3] > 0]
        if cpu:  # a block shorter than a clock tick reads 0 CPU
            report.ratio(f"call_one_cpu_vs_raw_{t}_pin_{args.pin}", cpu, "main threads' CPU µs per call, rlmesh / raw")
    for what, rs in rows.items():
        report.row(what=what, wall_us=[r[0] for r in rs], caller_main_us=[r[1] for r in rs],
                   server_main_us=[r[3] for r in rs])
    report.write(args.json)


if __name__ == "__main__":
    main()
