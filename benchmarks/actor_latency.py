"""Actor call latency, pipelined calls and argument bandwidth: rlmesh against raw pyzmq on the same
transport, floor and subject interleaved round by round; Ray and Monarch where installed.

    python benchmarks/actor_latency.py [--rounds 8] [--n 1000] [--json actor_latency.json]   # --smoke: seconds

Each round runs, in alternating order, a block of the raw floor and the same block through rlmesh,
so a change of load or of the scheduler's placement hits both sides alike; the script prints the
median and p90 of the per-round ratios:

- ``call_one`` round trip (async and sync endpoints) against raw pyzmq DEALER/ROUTER over an
  abstract Unix socket with 4 MiB kernel buffers: the transport and buffers rlmesh's data plane
  uses between local procs (``RLMESH_LOCAL_TRANSPORT``); the p90 of each block as well;
- pipelined ``call`` on a 4-actor mesh (every call in flight at once) against raw pyzmq sending the
  same number of messages to 4 ROUTER processes before reading the replies;
- a 64 MiB tensor argument against raw pyzmq sending the same bytes zero-copy over the same socket.

The raw client runs in a process of its own (rlmesh's threads never share its interpreter), and each
raw ROUTER in another. Then, with ``--curve``, the same interleaving with CurveZMQ on both sides
(``RLMESH_TRANSPORT_ENCRYPTION=always`` against raw pyzmq CURVE, both over loopback TCP). Ray and
Monarch run in their own subprocesses after, when installed (their ratios are not interleaved).
Targets (issue 40): ``call_one`` p90 <= 2.5x the floor's p90 at load <= 8; pipelined >= 0.3x raw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, have, load, median, p90, run_json, timed  # noqa: E402

MIB64 = 64 * 1024 * 1024
UNIX_BUFFER_BYTES = 4 << 20  # rlmesh.transport.sockets.UNIX_BUFFER_BYTES: the floor gets the same buffers


def _zmq_server(addr_q, curve_keys=None, transport: str = "tcp") -> None:
    """The raw floor's ROUTER: loopback TCP, or (``transport="ipc"``) a Linux abstract Unix socket with
    rlmesh's kernel buffer sizes, the transport rlmesh's data plane uses between local procs."""
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    if curve_keys:  # CURVE without a ZAP handler: the same crypto as rlmesh's, no key check
        s.curve_server, s.curve_publickey, s.curve_secretkey = True, *curve_keys
    if transport == "ipc":
        s.setsockopt(zmq.SNDBUF, UNIX_BUFFER_BYTES)
        s.setsockopt(zmq.RCVBUF, UNIX_BUFFER_BYTES)
        addr = f"ipc://@rlmesh-bench-raw-{os.getpid()}"
        s.bind(addr)
        addr_q.put(addr)
    else:
        port = s.bind_to_random_port("tcp://127.0.0.1")
        addr_q.put(f"tcp://127.0.0.1:{port}")
    while True:
        ident, *frames = s.recv_multipart(copy=False)
        if len(frames[0]) == 4 and bytes(frames[0]) == b"quit":  # never copy a 64 MiB frame to compare it
            return
        s.send_multipart([ident, b"ok"])


def _raw_client(addrs: list[str], curve_keys, transport: str, jobs, results) -> None:
    """The floor's caller, in a process of its own: one DEALER per server; runs each job it is sent."""
    import numpy as np
    import zmq

    ctx = zmq.Context()
    socks = []
    for addr in addrs:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        if transport == "ipc":
            s.setsockopt(zmq.SNDBUF, UNIX_BUFFER_BYTES)
            s.setsockopt(zmq.RCVBUF, UNIX_BUFFER_BYTES)
        if curve_keys:
            pub, sec = zmq.curve_keypair()
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = curve_keys[0], pub, sec
        s.connect(addr)
        socks.append(s)
    one = socks[0]
    big = np.ones(MIB64, dtype=np.uint8)

    def rtt() -> None:
        one.send(b"ping")
        one.recv()

    def transfer() -> None:
        one.send(big, copy=False)
        one.recv()

    def pipelined(k: int) -> float:
        t = time.perf_counter()
        for s in socks:
            for _ in range(k):
                s.send(b"ping")
        for s in socks:
            for _ in range(k):
                s.recv()
        return k * len(socks) / (time.perf_counter() - t)

    timed(rtt, 0, warmup=200)
    pipelined(50)
    while (job := jobs.get()) is not None:
        kind, n = job
        if kind == "rtt":
            results.put(timed(rtt, n, warmup=0))
        elif kind == "pipe":
            results.put(pipelined(n))
        else:
            results.put(timed(transfer, n, warmup=1))
    for s in socks:
        s.send(b"quit")


class RawFloor:
    """Raw pyzmq servers and their client, each in a process of its own; ``run`` runs one block."""

    def __init__(self, servers: int, transport: str, curve: bool = False) -> None:
        import zmq

        ctx = mp.get_context("spawn")
        keys = zmq.curve_keypair() if curve else None
        q = ctx.Queue()
        self.servers = [ctx.Process(target=_zmq_server, args=(q, keys, transport), daemon=True) for _ in range(servers)]
        for p in self.servers:
            p.start()
        addrs = [q.get(timeout=60) for _ in self.servers]
        self.jobs, self.results = ctx.Queue(), ctx.Queue()
        self.client = ctx.Process(target=_raw_client, args=(addrs, keys, transport, self.jobs, self.results), daemon=True)
        self.client.start()

    def run(self, kind: str, n: int):
        self.jobs.put((kind, n))
        return self.results.get(timeout=600)

    def close(self) -> None:
        self.jobs.put(None)
        for p in (self.client, *self.servers):
            p.join(10)


def echo_actor() -> type:
    import rlmesh as rm  # deferred: the curve child sets its environment before rlmesh reads it

    class Echo(rm.Actor):
        @rm.endpoint
        async def ping(self, x=None):
            return x

        @rm.endpoint
        def ping_sync(self, x=None):
            return x

        @rm.endpoint
        async def nbytes(self, t) -> int:
            return t.numel() * t.element_size()

    return Echo


def interleaved(rounds: int, n: int, pipe: int, big: int, transport: str, curve: bool = False) -> dict:
    """Every figure, floor and rlmesh block by block, the order alternating each round."""
    import torch

    import rlmesh as rm

    floor = RawFloor(4, transport, curve)
    out: dict[str, list[float]] = {k: [] for k in (
        "raw_rtt", "raw_rtt_p90", "rm_rtt", "rm_rtt_p90", "rm_sync", "raw_pipe", "rm_pipe", "raw_big", "rm_big")}
    try:
        with rm.this_host().spawn_procs(per_host={"procs": 4}) as procs:
            mesh = procs.spawn("echo", echo_actor())
            one = mesh.slice(procs=0)
            loop = asyncio.new_event_loop()

            async def gather(k: int) -> float:
                t = time.perf_counter()
                await asyncio.gather(*[mesh.ping.call(i) for i in range(k)])
                return 4 * k / (time.perf_counter() - t)

            tensor = torch.ones(MIB64, dtype=torch.uint8)
            timed(lambda: one.ping.call_one().get(), 0, warmup=200)
            loop.run_until_complete(gather(50))

            def raw_side() -> None:
                lat = floor.run("rtt", n)
                out["raw_rtt"].append(median(lat))
                out["raw_rtt_p90"].append(p90(lat))
                out["raw_pipe"].append(floor.run("pipe", pipe))
                out["raw_big"].append(median(floor.run("big", big)))

            def rlmesh_side() -> None:
                lat = timed(lambda: one.ping.call_one().get(), n, warmup=0)
                out["rm_rtt"].append(median(lat))
                out["rm_rtt_p90"].append(p90(lat))
                out["rm_sync"].append(median(timed(lambda: one.ping_sync.call_one().get(), n, warmup=0)))
                out["rm_pipe"].append(loop.run_until_complete(gather(pipe)))
                out["rm_big"].append(median(timed(lambda: one.nbytes.call_one(tensor).get(), big, warmup=1)))

            for i in range(rounds):
                for side in ((raw_side, rlmesh_side) if i % 2 == 0 else (rlmesh_side, raw_side)):
                    side()
            loop.close()
    finally:
        floor.close()
    return out


def report_rounds(report: Report, res: dict, label: str) -> None:
    gbps = lambda s: MIB64 / s / 1e9  # noqa: E731
    med = statistics.median
    print(f"\n{'measurement (' + label + '), medians of rounds':<52}{'raw floor':>14}{'rlmesh':>14}")
    print(f"{'call_one round trip, async endpoint':<52}{med(res['raw_rtt']) * 1e6:>11.1f} µs{med(res['rm_rtt']) * 1e6:>11.1f} µs")
    print(f"{'call_one round trip p90':<52}{med(res['raw_rtt_p90']) * 1e6:>11.1f} µs{med(res['rm_rtt_p90']) * 1e6:>11.1f} µs")
    print(f"{'call_one round trip, sync endpoint':<52}{'':>14}{med(res['rm_sync']) * 1e6:>11.1f} µs")
    print(f"{'pipelined calls on 4 actors/servers':<52}{med(res['raw_pipe']):>9.0f} /s{med(res['rm_pipe']):>12.0f} /s")
    print(f"{'64 MiB argument':<52}{gbps(med(res['raw_big'])):>9.2f} GB/s{gbps(med(res['rm_big'])):>9.2f} GB/s")
    report.row(transport=label, raw_rtt_us=med(res["raw_rtt"]) * 1e6, rlmesh_rtt_us=med(res["rm_rtt"]) * 1e6,
               raw_rtt_p90_us=med(res["raw_rtt_p90"]) * 1e6, rlmesh_rtt_p90_us=med(res["rm_rtt_p90"]) * 1e6,
               rlmesh_sync_us=med(res["rm_sync"]) * 1e6, raw_pipelined_per_s=med(res["raw_pipe"]),
               rlmesh_pipelined_per_s=med(res["rm_pipe"]), raw_64mib_gbps=gbps(med(res["raw_big"])),
               rlmesh_64mib_gbps=gbps(med(res["rm_big"])))
    zipped = lambda a, b: [x / y for x, y in zip(res[a], res[b])]  # noqa: E731
    report.ratio(f"call_one_{label}", zipped("rm_rtt", "raw_rtt"), "rlmesh µs / raw µs")
    p90r = report.ratio(f"call_one_p90_{label}", zipped("rm_rtt_p90", "raw_rtt_p90"), "rlmesh p90 / raw p90")
    report.ratio(f"call_one_sync_{label}", zipped("rm_sync", "raw_rtt"), "rlmesh µs / raw µs")
    pipe = report.ratio(f"pipelined_{label}", zipped("rm_pipe", "raw_pipe"), "rlmesh calls/s / raw calls/s")
    report.ratio(f"arg_64mib_{label}", zipped("raw_big", "rm_big"), "rlmesh GB/s / raw GB/s")
    if label == "ipc":
        report.target("call_one_p90", p90r.median, 2.5, note=f"load {load():.1f}; the target is at load <= 8")
        report.target("pipelined", pipe.median, 0.3, at_most=False)


def bench_ray(n: int) -> dict:
    import ray
    import torch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)

    @ray.remote
    class Echo:
        def ping(self, x=None):
            return x

        def nbytes(self, t) -> int:
            return t.numel() * t.element_size()

    a = Echo.remote()
    lat = timed(lambda: ray.get(a.ping.remote()), n)
    big = torch.ones(MIB64, dtype=torch.uint8)
    bw = timed(lambda: ray.get(a.nbytes.remote(big)), 8, warmup=2)
    ray.shutdown()
    return {"rtt_s": median(lat), "rtt_p90_s": p90(lat), "mib64_s": median(bw)}


def bench_monarch(n: int) -> dict:
    import torch
    from monarch.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        async def ping(self, x=None):
            return x

        @endpoint
        async def nbytes(self, t) -> int:
            return t.numel() * t.element_size()

    procs = this_host().spawn_procs(per_host={"procs": 1})
    a = procs.spawn("echo", Echo)
    lat = timed(lambda: a.ping.call_one().get(), n)
    big = torch.ones(MIB64, dtype=torch.uint8)
    bw = timed(lambda: a.nbytes.call_one(big).get(), 8, warmup=2)
    return {"rtt_s": median(lat), "rtt_p90_s": p90(lat), "mib64_s": median(bw)}


BENCHES = {"ray": bench_ray, "monarch": bench_monarch}
PACKAGES = {"ray": "ray", "monarch": "monarch"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="interleaved raw/rlmesh rounds")
    ap.add_argument("--n", type=int, default=1000, help="round trips per block")
    ap.add_argument("--pipelined", type=int, default=2000, help="calls per actor in a pipelined block")
    ap.add_argument("--big", type=int, default=4, help="64 MiB transfers per block")
    ap.add_argument("--curve", action="store_true", help="also the same rounds with CurveZMQ on both sides")
    ap.add_argument("--no-frameworks", action="store_true", help="skip Ray and Monarch (the floors only)")
    ap.add_argument("--only", choices=[*sorted(BENCHES), "curve"], help=argparse.SUPPRESS)
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.n, args.pipelined, args.big = 2, 100, 100, 1
    if args.only == "curve":
        os.environ["RLMESH_TRANSPORT_ENCRYPTION"] = "always"  # read when each socket binds, here and in workers
        print(json.dumps(interleaved(args.rounds, args.n, args.pipelined, args.big, "tcp", curve=True)))
        return
    if args.only:
        print(json.dumps(BENCHES[args.only](args.n)))
        return
    banner("actor calls: rlmesh against raw pyzmq on the same transport, interleaved", "torch", "ray", "torchmonarch")
    report = Report("actor_latency", smoke=args.smoke, args=vars(args))
    transport = "ipc" if sys.platform.startswith("linux") else "tcp"
    res = interleaved(args.rounds, args.n, args.pipelined, args.big, transport)
    report_rounds(report, res, transport)
    if args.curve:
        cur = run_json([os.path.abspath(__file__), "--only", "curve", "--rounds", str(args.rounds), "--n", str(args.n),
                        "--pipelined", str(args.pipelined), "--big", str(args.big)])
        if cur is None:
            report.skipped("curve", "the CurveZMQ child failed (its stderr is above)")
        else:
            report_rounds(report, cur, "curve")
    rm_rtt = statistics.median(res["rm_rtt"])
    for other in ("ray", "monarch"):
        if args.smoke or args.no_frameworks:
            report.skipped(other, "--smoke and --no-frameworks run the raw floors only (each of these starts a "
                                  "runtime: tens of seconds)")
            continue
        if not have(PACKAGES[other]):
            report.skipped(other, f"{other} is not installed (pip install -e '.[bench]')")
            continue
        o = run_json([os.path.abspath(__file__), "--only", other, "--n", str(max(50, args.n // 4))])
        if not o:
            report.skipped(other, f"{other} failed (its stderr is above)")
            continue
        print(f"{other} actor round trip {o['rtt_s'] * 1e6:.1f} µs; 64 MiB argument {MIB64 / o['mib64_s'] / 1e9:.2f} GB/s")
        report.ratio(f"call_one_vs_{other}", [rm_rtt / o["rtt_s"]], f"rlmesh µs / {other} µs, sequential, not interleaved")
        report.row(framework=other, rtt_us=o["rtt_s"] * 1e6, mib64_gbps=MIB64 / o["mib64_s"] / 1e9)
    report.write(args.json)


if __name__ == "__main__":
    main()
