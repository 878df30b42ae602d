"""``call_one`` against raw pyzmq, interleaved: the ratio with both sides measured at the same moments.

    python benchmarks/actor_latency_paired.py [--rounds 10] [--block 500] [--load 0] [--pin none|same|split]
                                             [--raw same|tcp|ipc] [--json PATH] [--smoke]

The raw floor runs over the transport rlmesh's data plane uses between local procs (``--raw same``,
the default: an abstract Unix socket on Linux since 6 Dec 2026, loopback TCP before), so the ratio
compares like with like; ``--raw tcp`` gives the ratio against the TCP floor that earlier runs used.

Why a second latency script: ``actor_latency.py`` measures raw zmq, then rlmesh, each in its own
process, one after the other. On a VM the raw floor is not one number: a DEALER/ROUTER round
trip took 23-27 µs in some stretches and 95-130 µs in others, on the same quiet machine, minutes
apart (5 Dec 2026). The modes are placement: a hop to a process on the same core is a context
switch (fast), a hop to the other core wakes it (slow), and ``--pin`` below fixes one or the other.
A ratio of two numbers taken at different moments can land on either side of that, so it swings
between runs.

Here the two alternate in blocks (``--block`` calls of raw zmq, then as many ``call_one``, for
``--rounds`` rounds), each round's ratio is its rlmesh median over its raw median, and the
script prints every round, then the median and the range of the ratios. The raw client runs in
its own process, so rlmesh's background threads never slow the floor. ``--load K`` starts K busy
loops (at normal priority) for the whole measurement: the "at load 6" condition of issue 16,
reproducible (``--load 6``). With busy loops no vCPU idles, so the raw floor is its fast one.

``--pin`` takes the scheduler's placement out of it: ``same`` puts every process of the measurement
(callers and servers, raw and rlmesh) on CPU 0, so each hop is a context switch on one core and
the round trip is the CPU work of both sides; ``split`` puts the callers on CPU 0 and the servers
(the raw ROUTER, rlmesh's worker procs and all their threads) on CPU 1, so each hop wakes the
other core. Busy loops stay free to run anywhere.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, median, timed  # noqa: E402
from actor_latency import _zmq_server  # noqa: E402  (the same raw ROUTER server as the sequential script)


def _raw_client(addr: str, blocks, medians) -> None:
    """Runs one block of round trips per number it is sent; answers each with the block's median."""
    import zmq

    s = zmq.Context().socket(zmq.DEALER)
    s.connect(addr)

    def rtt() -> None:
        s.send(b"ping")
        s.recv()

    while (n := blocks.get()) is not None:
        medians.put(median(timed(rtt, n)))
    s.send(b"quit")


def _busy() -> None:
    while True:
        pass


def _pinned(cpus: set[int] | None, target, *args) -> None:
    """Run ``target`` on ``cpus`` (set before it starts any thread, so its threads inherit them)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    target(*args)


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (affinity is per thread on Linux)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def echo_actor() -> type:
    """The actor the latency scripts call: an async ``ping`` and ``pid`` (to pin its proc). Made in a
    function so that workers get it by value, as a class defined in ``main`` would be."""
    import rlmesh as rm  # here, not at the top: callers set their CPU affinity before rlmesh starts a thread

    class Echo(rm.Actor):
        @rm.endpoint
        async def ping(self, x=None):
            return x

        @rm.endpoint
        def pid(self) -> int:
            return os.getpid()

    return Echo


def _rlmesh_block(ep, n: int) -> float:
    return median(timed(lambda: ep.call_one().get(), n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="raw-then-rlmesh rounds")
    ap.add_argument("--block", type=int, default=500, help="round trips per side per round")
    ap.add_argument("--load", type=int, default=0, help="busy loops to run beside it (issue 16: --load 6)")
    ap.add_argument("--raw", choices=("same", "tcp", "ipc"), default="same",
                    help="the raw floor's transport: same (default: what rlmesh's data plane uses between local "
                         "procs, RLMESH_LOCAL_TRANSPORT), or tcp / ipc")
    ap.add_argument("--pin", choices=("none", "same", "split"), default="none",
                    help="same: everything on CPU 0; split: callers on CPU 0, servers on CPU 1")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.block = 2, 100
    report = Report("actor_latency_paired", smoke=args.smoke, args=vars(args))
    banner(f"call_one vs raw pyzmq, interleaved ({args.rounds} rounds of {args.block}, {args.load} busy loops, "
           f"pin {args.pin})")
    if args.pin != "none" and not hasattr(os, "sched_setaffinity"):
        raise SystemExit("--pin needs Linux (os.sched_setaffinity)")
    everywhere = os.sched_getaffinity(0) if args.pin != "none" else None
    if args.pin == "split" and len(everywhere) < 2:
        raise SystemExit("--pin split needs two CPUs")
    caller_cpus = None if args.pin == "none" else {0}
    server_cpus = {"none": None, "same": {0}, "split": {1}}[args.pin]
    if caller_cpus is not None:
        os.sched_setaffinity(0, caller_cpus)  # before rlmesh starts a thread: they all inherit it

    import rlmesh as rm

    Echo = echo_actor()
    spawn = mp.get_context("spawn")
    addr_q, blocks, medians = spawn.Queue(), spawn.Queue(), spawn.Queue()
    from rlmesh.transport.sockets import local_transport

    raw = local_transport() if args.raw == "same" else args.raw
    print(f"# raw floor over {raw}; rlmesh's data plane between local procs: {local_transport()}")
    helpers = [spawn.Process(target=_pinned, args=(server_cpus, _zmq_server, addr_q, None, raw), daemon=True)]
    helpers[0].start()
    helpers.append(spawn.Process(target=_pinned, args=(caller_cpus, _raw_client, addr_q.get(timeout=60), blocks,
                                                       medians), daemon=True))
    helpers[1].start()
    hogs = [spawn.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
        if everywhere is not None:
            os.sched_setaffinity(h.pid, everywhere)  # busy loops run anywhere, whatever --pin did to us
    rows = []
    try:
        # Four procs, as actor_latency.py: their idle heartbeats and telemetry are part of the cost.
        with rm.this_host().spawn_procs(per_host={"procs": 4}) as procs:
            echoes = procs.spawn("echo", Echo)
            if server_cpus is not None:
                for pid in echoes.pid.call().get(timeout=60):
                    pin_process(pid, server_cpus)
            one = echoes.slice(procs=0)
            _rlmesh_block(one.ping, args.block)  # warm both sides before the first round
            blocks.put(args.block)
            medians.get(timeout=120)
            print(f"\n{'round':>5}{'load':>7}{'raw zmq':>12}{'call_one':>12}{'ratio':>9}")
            for r in range(1, args.rounds + 1):
                if r % 2:  # the order alternates round by round
                    blocks.put(args.block)
                    raw = medians.get(timeout=600)
                    ours = _rlmesh_block(one.ping, args.block)
                else:
                    ours = _rlmesh_block(one.ping, args.block)
                    blocks.put(args.block)
                    raw = medians.get(timeout=600)
                rows.append((raw, ours))
                print(f"{r:>5}{os.getloadavg()[0]:>7.1f}{raw * 1e6:>9.1f} µs{ours * 1e6:>9.1f} µs{ours / raw:>8.2f}x",
                      flush=True)
    finally:
        blocks.put(None)
        for h in hogs:
            h.terminate()
        for h in helpers:
            h.join(10)
    report.ratio(f"call_one_vs_raw_{args.raw}_pin_{args.pin}_load_{args.load}", [o / w for w, o in rows],
                 "rlmesh µs / raw µs, medians of blocks")
    report.row(raw_us=[w * 1e6 for w, _ in rows], rlmesh_us=[o * 1e6 for _, o in rows])
    report.write(args.json)
    ratios = sorted(o / w for w, o in rows)
    raws, ours = sorted(w for w, _ in rows), sorted(o for _, o in rows)
    print(f"\nraw zmq {raws[0] * 1e6:.1f}-{raws[-1] * 1e6:.1f} µs, call_one {ours[0] * 1e6:.1f}-{ours[-1] * 1e6:.1f} µs; "
          f"ratio median {median(ratios):.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f}x)")
    fast = [o / w for w, o in rows if w < 50e-6]
    if fast and len(fast) < len(rows):
        print(f"rounds where the raw floor was its fast one (< 50 µs, no wake-up from idle): {len(fast)} of "
              f"{len(rows)}, ratio {min(fast):.2f}-{max(fast):.2f}x there")


if __name__ == "__main__":
    main()
