"""Actor call latency and argument bandwidth: rlmesh vs raw pyzmq (the floor), Ray and Monarch.

    python benchmarks/actor_latency.py [--n 2000]

Prints, from one run on this machine: raw pyzmq DEALER/ROUTER round trip between
two processes, rlmesh ``call_one`` round trip (async and sync endpoints),
pipelined ``call`` throughput on a 4-actor mesh, and a 64 MiB tensor argument
(GB/s) against raw zmq moving the same bytes; each as a value and as a ratio to
its floor. Then the same with encryption: rlmesh with CurveZMQ forced on
(``RLMESH_TRANSPORT_ENCRYPTION=always``, what every connection off loopback uses)
beside raw pyzmq with CURVE, all in the same run. Ray and Monarch run in their
own subprocesses when installed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import banner, median, p90, run_json, timed  # noqa: E402

MIB64 = 64 * 1024 * 1024


def _zmq_server(addr_q, curve_keys=None, transport: str = "tcp") -> None:
    """The raw floor's ROUTER: loopback TCP, or (``transport="ipc"``) a Linux abstract Unix socket, the
    transport rlmesh's data plane uses between local procs (``RLMESH_LOCAL_TRANSPORT``)."""
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    if curve_keys:  # CURVE without a ZAP handler: the same crypto as rlmesh's, no key check
        s.curve_server, s.curve_publickey, s.curve_secretkey = True, *curve_keys
    if transport == "ipc":
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


def bench_zmq(n: int, curve: bool = False, transport: str = "tcp") -> dict:
    import numpy as np
    import zmq

    keys = zmq.curve_keypair() if curve else None
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_zmq_server, args=(q, keys, transport), daemon=True)
    p.start()
    addr = q.get(timeout=30)
    s = zmq.Context.instance().socket(zmq.DEALER)
    if keys:
        client_pub, client_sec = zmq.curve_keypair()
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = keys[0], client_pub, client_sec
    s.connect(addr)

    def rtt() -> None:
        s.send(b"ping")
        s.recv()

    lat = timed(rtt, n)
    big = np.ones(MIB64, dtype=np.uint8)

    def transfer() -> None:
        s.send(big, copy=False)
        s.recv()

    bw = timed(transfer, 8, warmup=2)
    s.send(b"quit")
    p.join(5)
    return {"rtt_s": median(lat), "rtt_p90_s": p90(lat), "mib64_s": median(bw)}


def bench_rlmesh(n: int) -> dict:
    import asyncio

    import torch

    import rlmesh as rm

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

    with rm.this_host().spawn_procs(per_host={"procs": 4}) as procs:
        mesh = procs.spawn("echo", Echo)
        one = mesh.slice(procs=0)
        lat = timed(lambda: one.ping.call_one().get(), n)
        lat_sync = timed(lambda: one.ping_sync.call_one().get(), n)

        async def pipelined(rounds: int) -> float:
            t = time.perf_counter()
            await asyncio.gather(*[mesh.ping.call(i) for i in range(rounds)])
            return time.perf_counter() - t

        rounds = max(200, n // 2)
        asyncio.run(pipelined(50))
        dt = asyncio.run(pipelined(rounds))
        big = torch.ones(MIB64, dtype=torch.uint8)
        bw = timed(lambda: one.nbytes.call_one(big).get(), 8, warmup=2)
    return {"rtt_s": median(lat), "rtt_p90_s": p90(lat), "rtt_sync_s": median(lat_sync),
            "pipelined_calls_per_s": rounds * 4 / dt, "mib64_s": median(bw)}


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


def bench_zmq_curve(n: int) -> dict:
    return bench_zmq(n, curve=True)


def bench_zmq_ipc(n: int) -> dict:
    """The raw floor over an abstract Unix socket: rlmesh's data plane between local procs on Linux."""
    return bench_zmq(n, transport="ipc")


def bench_rlmesh_curve(n: int) -> dict:
    os.environ["RLMESH_TRANSPORT_ENCRYPTION"] = "always"  # read when each socket binds, here and in the workers
    return bench_rlmesh(n)


BENCHES = {"zmq": bench_zmq, "zmq_ipc": bench_zmq_ipc, "rlmesh": bench_rlmesh, "zmq_curve": bench_zmq_curve,
           "rlmesh_curve": bench_rlmesh_curve, "ray": bench_ray, "monarch": bench_monarch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="timed round trips per measurement")
    ap.add_argument("--only", choices=sorted(BENCHES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only:
        print(json.dumps(BENCHES[args.only](args.n)))
        return
    banner("actor call latency and 64 MiB argument bandwidth", "torch", "ray", "torchmonarch")
    res = {}
    linux = sys.platform.startswith("linux")
    for name in ("zmq", *(("zmq_ipc",) if linux else ()), "rlmesh", "zmq_curve", "rlmesh_curve", "ray", "monarch"):
        n = args.n if name in ("zmq", "zmq_ipc", "rlmesh", "zmq_curve", "rlmesh_curve") else max(200, args.n // 4)
        res[name] = run_json([os.path.abspath(__file__), "--only", name, "--n", str(n)])
    z = res["zmq"]
    if z is None:
        sys.exit("raw zmq baseline failed")
    gbps = lambda s: MIB64 / s / 1e9  # noqa: E731
    print(f"\n{'measurement':<44}{'value':>14}{'ratio':>12}")
    print(f"{'raw pyzmq round trip (floor)':<44}{z['rtt_s'] * 1e6:>11.1f} µs{1.0:>11.2f}x")
    print(f"{'raw pyzmq 64 MiB (floor)':<44}{gbps(z['mib64_s']):>9.2f} GB/s{1.0:>11.2f}x")
    zi = res.get("zmq_ipc")
    if zi:  # rlmesh's local procs talk over this: the like-for-like floor (ratios in brackets below)
        print(f"{'raw pyzmq round trip, ipc (rlmesh local)':<44}{zi['rtt_s'] * 1e6:>11.1f} µs"
              f"{zi['rtt_s'] / z['rtt_s']:>11.2f}x")
        print(f"{'raw pyzmq 64 MiB, ipc':<44}{gbps(zi['mib64_s']):>9.2f} GB/s{z['mib64_s'] / zi['mib64_s']:>11.2f}x")
    r = res["rlmesh"]
    if r:
        print(f"{'rlmesh call_one round trip (async ep)':<44}{r['rtt_s'] * 1e6:>11.1f} µs"
              f"{r['rtt_s'] / z['rtt_s']:>11.2f}x  (target <= 2x)"
              + (f"  [{r['rtt_s'] / zi['rtt_s']:.2f}x raw ipc]" if zi else ""))
        print(f"{'rlmesh call_one round trip (sync ep)':<44}{r['rtt_sync_s'] * 1e6:>11.1f} µs"
              f"{r['rtt_sync_s'] / z['rtt_s']:>11.2f}x")
        print(f"{'rlmesh call_one p90':<44}{r['rtt_p90_s'] * 1e6:>11.1f} µs")
        print(f"{'rlmesh pipelined call, 4-actor mesh':<44}{r['pipelined_calls_per_s']:>8.0f} calls/s")
        print(f"{'rlmesh 64 MiB tensor argument':<44}{gbps(r['mib64_s']):>9.2f} GB/s"
              f"{z['mib64_s'] / r['mib64_s']:>11.2f}x  (target >= 0.7x)")
    zc, rc = res["zmq_curve"], res["rlmesh_curve"]
    print("\nencrypted (CurveZMQ: every connection off loopback; ratio = encrypted time / plain time, 1.00x = free)")
    if zc:
        print(f"{'raw pyzmq CURVE round trip':<44}{zc['rtt_s'] * 1e6:>11.1f} µs{zc['rtt_s'] / z['rtt_s']:>11.2f}x")
        print(f"{'raw pyzmq CURVE 64 MiB':<44}{gbps(zc['mib64_s']):>9.2f} GB/s{zc['mib64_s'] / z['mib64_s']:>11.2f}x")
    if rc and r:
        print(f"{'rlmesh CurveZMQ call_one round trip (async)':<44}{rc['rtt_s'] * 1e6:>11.1f} µs"
              f"{rc['rtt_s'] / r['rtt_s']:>11.2f}x" + (f"  ({rc['rtt_s'] / zc['rtt_s']:.2f}x raw CURVE)" if zc else ""))
        print(f"{'rlmesh CurveZMQ call_one round trip (sync)':<44}{rc['rtt_sync_s'] * 1e6:>11.1f} µs"
              f"{rc['rtt_sync_s'] / r['rtt_sync_s']:>11.2f}x")
        print(f"{'rlmesh CurveZMQ pipelined call, 4 actors':<44}{rc['pipelined_calls_per_s']:>8.0f} calls/s"
              f"{r['pipelined_calls_per_s'] / rc['pipelined_calls_per_s']:>11.2f}x")
        print(f"{'rlmesh CurveZMQ 64 MiB tensor argument':<44}{gbps(rc['mib64_s']):>9.2f} GB/s"
              f"{rc['mib64_s'] / r['mib64_s']:>11.2f}x" + (f"  ({rc['mib64_s'] / zc['mib64_s']:.2f}x raw CURVE)" if zc else ""))
    print()
    for other in ("ray", "monarch"):
        o = res[other]
        if not o:
            print(f"{other}: not installed or failed (pip install -e '.[bench]')")
            continue
        print(f"{other + ' actor round trip':<44}{o['rtt_s'] * 1e6:>11.1f} µs{o['rtt_s'] / z['rtt_s']:>11.2f}x")
        print(f"{other + ' 64 MiB tensor argument':<44}{gbps(o['mib64_s']):>9.2f} GB/s"
              f"{z['mib64_s'] / o['mib64_s']:>11.2f}x")
        if r:
            print(f"{'  rlmesh latency as a fraction of ' + other:<44}{r['rtt_s'] / o['rtt_s']:>14.2f}"
                  f"   (target <= 0.25)")


if __name__ == "__main__":
    main()
