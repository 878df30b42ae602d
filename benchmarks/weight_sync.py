"""Weight sync: a state_dict to 1 and 2 readers in other processes, rlmesh against its floors,
every method interleaved round by round.

    .venv/bin/python benchmarks/weight_sync.py [--gib 1] [--rounds 5] [--json weight_sync.json]   # --smoke: seconds
    .venv/bin/python benchmarks/weight_sync.py --tcp-only --gib 0.5     # TCP pull against recv_into at one size

Per reader count, each round runs every method once, the order rotating round by round, after one
untimed warm-up round of every method (rlmesh's first round is treated like the others'):

- memcpy: one copy stream of the same bytes in this process (what one reader's pull must do);
- rlmesh shm and tcp: **publish + pull**, the whole operation a trainer and its generators wait for
  (the publish copies the tensors and checksums them; then every reader pulls), and the pull alone;
- raw pyzmq PUSH/PULL into one reused buffer with ``recv_into`` (the sender's time included);
- torch.distributed gloo broadcast of one flat buffer holding every byte (its strongest form).

Ratios are per round, bandwidth per reader against the floor measured in the same round (median and
p90 printed). Targets (issue 40): a pull >= 0.7x one copy stream with one reader, >= 0.4x each with
two; TCP pull >= 0.9x ``recv_into`` (``--tcp-only`` at 64 MiB, 0.5 GiB and 1 GiB). CurveZMQ figures
(``--curve``) sit beside the plain ones: rlmesh tcp encrypted against raw pyzmq CURVE. Then the stall a
concurrent loop in the publisher sees while a version is published.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # no spinning OpenMP pools on a shared host: threads are explicit
os.environ.setdefault("RLMESH_TELEMETRY", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner  # noqa: E402

GiB = 1 << 30


def spec(total: int) -> list[tuple[str, int]]:
    """~300 float32 tensors: a few large (embedding-like), many medium, a tail of small ones."""
    sizes = [32 << 20] * 20 + [4 << 20] * 60 + [1 << 20] * 100 + [16 << 10] * 119
    scale = total / sum(sizes)
    out = [(f"layer{i}.w", max(64, int(s * scale) // 64 * 64)) for i, s in enumerate(sizes)]
    out.append(("tail", max(64, (total - sum(n for _, n in out)) // 64 * 64)))
    return out


def make_sd(total: int, fill: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(n // 4, generator=g) if fill else torch.zeros(n // 4)) for k, n in spec(total)}


# ---------------- reader process ----------------
def reader_main(total: int) -> None:
    from rlmesh.weights import Subscriber

    target = make_sd(total, fill=False)
    module = None  # the same tensors as a model holds them, made on the first pull into a module

    def make_module() -> torch.nn.Module:
        m = torch.nn.Module()  # a generator pulls into its policy
        for k, t in make_sd(total, fill=False).items():
            parent = m
            *path, leaf = k.split(".")
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, torch.nn.Module())
                parent = getattr(parent, part)
            parent.register_buffer(leaf, t)
        return m

    subs: dict = {}
    into_bufs: dict = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        t0 = time.perf_counter()
        if cmd["op"] == "pull":
            name = cmd.get("name", "bench")
            sub = subs.setdefault((name, cmd["transport"]), Subscriber(name, cmd["transport"]))
            if cmd.get("module") and module is None:
                module = make_module()
            v = sub.pull_into(module if cmd.get("module") else target, min_version=cmd["version"], timeout=120)
            res = {"seconds": v.stats.seconds, "verify": v.stats.verify_seconds, "copy": v.stats.copy_seconds,
                   "fetch": v.stats.fetch_seconds, "version": int(v)}
        elif cmd["op"] == "prepare":  # a generator's __init__: connect and map the publisher's slots ahead
            name = cmd.get("name", "bench")
            sub = subs.setdefault((name, cmd["transport"]), Subscriber(name, cmd["transport"]))
            res = {"ready": sub.prepare(timeout=30), "seconds": time.perf_counter() - t0}
        elif cmd["op"] == "forget":  # a publisher is gone: its subscribers' buffers and mappings go too
            for key in [k for k in subs if k[0] == cmd["name"]]:
                subs.pop(key).close()
            res = {"done": True}
        elif cmd["op"] == "zmq":
            s = zmq.Context.instance().socket(zmq.PULL)
            if cmd.get("curve"):
                pub_k, sec_k = zmq.curve_keypair()
                s.curve_serverkey, s.curve_publickey, s.curve_secretkey = cmd["curve"].encode(), pub_k, sec_k
            s.connect(cmd["addr"])
            if cmd["into"]:  # the best raw form: one buffer, mapped once, reused
                buf = into_bufs.get(cmd["nbytes"])
                if buf is None:
                    buf = into_bufs[cmd["nbytes"]] = np.ones(cmd["nbytes"], dtype=np.uint8)
            print(json.dumps({"ready": True}), flush=True)
            frames, got = [], 0
            t0 = time.perf_counter()
            while got < cmd["nbytes"]:
                if cmd["into"]:
                    got += s.recv_into(memoryview(buf[got:]))
                else:
                    f = s.recv(copy=False)
                    frames.append(f)
                    got += len(f.buffer)
            res = {"seconds": time.perf_counter() - t0}
            s.close(0)
        elif cmd["op"] == "gloo_init":  # one group per reader count, kept across the interleaved rounds
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=cmd["init"], rank=cmd["rank"], world_size=cmd["world"])
            flat = torch.empty(cmd["nbytes"] // 4)
            res = {"ready": True}
        elif cmd["op"] == "gloo":
            dist.barrier()
            dist.broadcast(flat, src=0)
            dist.barrier()
            res = {"seconds": time.perf_counter() - t0}
        elif cmd["op"] == "gloo_end":
            dist.destroy_process_group()
            flat = None  # its GiB back before the next reader count's group
            res = {"done": True}
        else:
            return
        print(json.dumps(res), flush=True)


class Reader:
    def __init__(self, total: int, env: dict):
        self.p = subprocess.Popen([sys.executable, __file__, "--reader", str(total)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)

    def send(self, **cmd) -> None:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def recv(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("reader process died")
        return json.loads(line)


# ---------------- measurements ----------------
def bench_memcpy(sd: dict, dst: dict) -> float:
    """One copy stream of every tensor: what one reader's pull does at the least."""
    t0 = time.perf_counter()
    for k, v in sd.items():
        dst[k].copy_(v)
    return time.perf_counter() - t0


def bench_zmq(sd: dict, readers: list, reps: int, into: bool = True, curve: bool = False) -> float:
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    times = []
    server_pub, server_sec = zmq.curve_keypair()
    for _ in range(reps):
        socks = []
        for r in readers:
            s = zmq.Context.instance().socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            if curve:  # CURVE without a ZAP handler: any client key, the same crypto as rlmesh's
                s.curve_server, s.curve_secretkey, s.curve_publickey = True, server_sec, server_pub
            port = s.bind_to_random_port("tcp://127.0.0.1")
            socks.append(s)
            r.send(op="zmq", addr=f"tcp://127.0.0.1:{port}", nbytes=nbytes, into=into,
                   curve=server_pub.decode() if curve else "")
            r.recv()
        time.sleep(0.05)  # the readers' connections complete before the clock starts
        t0 = time.perf_counter()
        for t in sd.values():
            buf = t.numpy()
            for s in socks:
                s.send(buf, copy=False)
        [r.recv() for r in readers]
        times.append(time.perf_counter() - t0)
        [s.close(0) for s in socks]
    return statistics.median(times)


class Gloo:
    """torch.distributed gloo broadcast of one flat buffer (every byte of the state_dict) to the readers."""

    def __init__(self, nbytes: int, readers: list) -> None:
        import torch.distributed as dist

        self.dist, self.readers = dist, readers
        self.path = tempfile.mktemp(prefix="rlmesh-gloo-")
        init = f"file://{self.path}"
        for i, r in enumerate(readers):
            r.send(op="gloo_init", init=init, rank=i + 1, world=len(readers) + 1, nbytes=nbytes)
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=len(readers) + 1)
        [r.recv() for r in readers]
        self.flat = torch.randn(nbytes // 4)

    def round(self) -> float:
        for r in self.readers:
            r.send(op="gloo")
        self.dist.barrier()
        t0 = time.perf_counter()
        self.dist.broadcast(self.flat, src=0)
        self.dist.barrier()
        dt = time.perf_counter() - t0
        [r.recv() for r in self.readers]
        return dt

    def close(self) -> None:
        for r in self.readers:
            r.send(op="gloo_end")
        self.dist.destroy_process_group()
        [r.recv() for r in self.readers]
        if os.path.exists(self.path):
            os.unlink(self.path)


def rlmesh_round(pub, sd: dict, transport: str, readers: list, version: list, module: bool = False) -> tuple[float, float]:
    """One version, published and pulled by every reader: (publish + pull wall seconds, pull seconds).
    ``module``: the readers pull into an ``nn.Module`` (TCP then swaps the verified bytes in) instead of a
    state_dict (copied into)."""
    version[0] += 1
    t0 = time.perf_counter()
    pub.publish(sd, version=version[0])
    t1 = time.perf_counter()
    for r in readers:
        r.send(op="pull", transport=transport, version=version[0], name=pub.name, module=module)
    res = [r.recv() for r in readers]
    t2 = time.perf_counter()
    assert all(x["version"] == version[0] for x in res)
    return t2 - t0, t2 - t1


def rotate(rounds: int, methods: dict) -> dict[str, list]:
    """One untimed warm-up call of every method, then ``rounds`` rounds of all, the order rotating."""
    names = list(methods)
    for name in names:
        methods[name]()
    out: dict[str, list] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names):] + names[: i % len(names)]:
            out[name].append(methods[name]())
    return out


def bench_stall(pub, sd: dict, version: list) -> tuple[float, float]:
    """Longest gap between iterations of a generator-like loop in another thread while one version is published."""
    stop, gaps = threading.Event(), []
    a = torch.randn(64, 64)

    def loop():
        last = time.perf_counter()
        while not stop.is_set():
            a @ a
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    th = threading.Thread(target=loop)
    th.start()
    time.sleep(0.2)
    gaps.clear()
    version[0] += 1
    t0 = time.perf_counter()
    pub.publish(sd, version=version[0])
    t_pub = time.perf_counter() - t0
    time.sleep(0.05)
    stop.set()
    th.join()
    return max(gaps), t_pub


def setup_env() -> None:
    from rlmesh.transport import Authenticator  # deferred: after OMP_NUM_THREADS is set above

    os.environ.update(RLMESH_WEIGHTS_DIRECTORY=tempfile.mkdtemp(prefix="rlmesh-bench-"),
                      RLMESH_SECRET=os.environ.get("RLMESH_SECRET") or Authenticator.new_secret().hex(),
                      RLMESH_JOB_ID=f"bench{os.getpid()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every method")
    ap.add_argument("--readers", type=int, nargs="+", default=[1, 2], help="reader counts")
    ap.add_argument("--curve", action="store_true", help="also rlmesh tcp with CurveZMQ against raw pyzmq CURVE")
    ap.add_argument("--reader", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tcp-only", action="store_true",
                    help="only raw pyzmq recv_into against rlmesh tcp (state_dict and module targets), 1 reader")
    add_common_args(ap)
    args = ap.parse_args()
    if args.reader:
        return reader_main(args.reader)
    if args.smoke:
        args.gib, args.rounds, args.readers = min(args.gib, 1 / 64), 2, [1]
    if args.tcp_only:
        return tcp_only(args)
    from rlmesh.weights import Publisher  # deferred: after OMP_NUM_THREADS is set above

    banner("weight sync: publish + pull against memcpy, raw pyzmq and gloo, interleaved", "torch")
    report = Report("weight_sync", smoke=args.smoke, args=vars(args))
    total = int(args.gib * GiB)
    setup_env()
    sd = make_sd(total, fill=True)
    dst = {k: torch.empty_like(v) for k, v in sd.items()}
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    gb = nbytes / 1e9
    readers = [Reader(total, dict(os.environ)) for _ in range(max(args.readers))]
    version = [0]
    print(f"\n{nbytes / GiB:.3f} GiB in {len(sd)} tensors; {args.rounds} rounds; GB/s per reader, medians of rounds")
    print(f"{'method':44s} {'readers':>7s} {'seconds':>8s} {'GB/s/reader':>12s}")
    with Publisher("bench") as pub:
        for _ in range(2):  # both slots (keep=2) exist before any round: the first round is warm-up anyway
            version[0] += 1
            pub.publish(sd, version=version[0])
        for n in args.readers:
            rs = readers[:n]
            gloo = Gloo(nbytes, rs)
            res = rotate(args.rounds, {
                "memcpy": lambda: bench_memcpy(sd, dst),
                "shm": lambda rs=rs: rlmesh_round(pub, sd, "shm", rs, version),
                "recv_into": lambda rs=rs: bench_zmq(sd, rs, 1),
                "tcp": lambda rs=rs: rlmesh_round(pub, sd, "tcp", rs, version),
                "gloo": gloo.round,
            })
            gloo.close()
            mc, raw, gl = res["memcpy"], res["recv_into"], res["gloo"]
            shm_all, shm_pull = [w for w, _ in res["shm"]], [p for _, p in res["shm"]]
            tcp_all, tcp_pull = [w for w, _ in res["tcp"]], [p for _, p in res["tcp"]]
            med = statistics.median
            for name, xs in (("memcpy, one copy stream (in-process)", mc), ("rlmesh shm, publish + pull", shm_all),
                             ("rlmesh shm, pull", shm_pull), ("raw pyzmq recv_into (sender included)", raw),
                             ("rlmesh tcp, publish + pull", tcp_all), ("rlmesh tcp, pull", tcp_pull),
                             ("gloo broadcast, one flat buffer", gl)):
                print(f"{name:44s} {n:7d} {med(xs):8.3f} {gb / med(xs):12.2f}")
                report.row(method=name, readers=n, seconds=med(xs), gbps_per_reader=gb / med(xs))
            per = lambda floor, subj: [f / s for f, s in zip(floor, subj)]  # noqa: E731  bandwidth ratio
            report.ratio(f"shm_publish_pull_vs_memcpy_{n}r", per(mc, shm_all), "GB/s per reader / memcpy GB/s")
            pull = report.ratio(f"shm_pull_vs_memcpy_{n}r", per(mc, shm_pull), "GB/s per reader / memcpy GB/s")
            report.target(f"shm_pull_vs_one_copy_stream_{n}r", pull.median, 0.7 if n == 1 else 0.4, at_most=False)
            report.ratio(f"shm_publish_pull_vs_gloo_{n}r", per(gl, shm_all), "rlmesh GB/s / gloo GB/s")
            report.ratio(f"tcp_publish_pull_vs_recv_into_{n}r", per(raw, tcp_all), "rlmesh GB/s / raw GB/s")
            report.ratio(f"tcp_pull_vs_recv_into_{n}r", per(raw, tcp_pull), "rlmesh GB/s / raw GB/s")
            report.ratio(f"tcp_publish_pull_vs_gloo_{n}r", per(gl, tcp_all), "rlmesh GB/s / gloo GB/s")
        stall, t_pub = bench_stall(pub, sd, version)
    if args.curve:
        os.environ["RLMESH_TRANSPORT_ENCRYPTION"] = "always"  # what every connection off loopback gets
        try:
            with Publisher("bench_curve") as pub:
                res = rotate(args.rounds, {
                    "raw_curve": lambda: bench_zmq(sd, readers[:1], 1, into=False, curve=True),
                    "tcp_curve": lambda: rlmesh_round(pub, sd, "tcp", readers[:1], version)[0],
                })
        finally:
            os.environ.pop("RLMESH_TRANSPORT_ENCRYPTION", None)
        report.ratio("tcp_curve_publish_pull_vs_raw_curve_1r",
                     [f / s for f, s in zip(res["raw_curve"], res["tcp_curve"])], "rlmesh GB/s / raw CURVE GB/s")
    for r in readers:
        r.send(op="quit")
        r.p.wait(timeout=30)
    print(f"\npublish: a concurrent loop in the publishing process stalled at most {stall * 1e3:.0f} ms while one "
          f"version was published (publish took {t_pub * 1e3:.0f} ms); readers in other procs are not blocked")
    report.row(figure="publish stall ms", stall_ms=stall * 1e3, publish_ms=t_pub * 1e3)
    report.write(args.json)


def tcp_only(args: argparse.Namespace) -> None:
    """rlmesh's TCP pull against raw pyzmq ``recv_into``, one reader, interleaved rounds, at ``--gib``."""
    from rlmesh.weights import Publisher  # deferred: after OMP_NUM_THREADS is set above

    banner(f"weight sync over TCP against raw pyzmq recv_into, {args.gib:g} GiB", "torch")
    report = Report("weight_sync_tcp", smoke=args.smoke, args=vars(args))
    total = int(args.gib * GiB)
    setup_env()
    sd = make_sd(total, fill=True)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    reader = Reader(total, dict(os.environ))
    version = [0]
    with Publisher("bench") as pub:
        for _ in range(2):
            version[0] += 1
            pub.publish(sd, version=version[0])
        res = rotate(args.rounds, {
            "recv_into": lambda: bench_zmq(sd, [reader], 1),
            "copy": lambda: rlmesh_round(pub, sd, "tcp", [reader], version),
            "swap": lambda: rlmesh_round(pub, sd, "tcp", [reader], version, module=True),
        })
    reader.send(op="quit")
    reader.p.wait(timeout=30)
    gb, raw = nbytes / 1e9, res["recv_into"]
    med = statistics.median
    print(f"tcp pull, {nbytes / GiB:.3f} GiB in {len(sd)} tensors, 1 reader, medians of {args.rounds} rounds")
    print(f"  {'raw pyzmq recv_into one buffer':40s} {med(raw):7.3f} s {gb / med(raw):6.2f} GB/s")
    for key, name in (("copy", "rlmesh tcp -> state_dict (copy)"), ("swap", "rlmesh tcp -> nn.Module (swap)")):
        pull = [p for _, p in res[key]]
        print(f"  {name + ', pull':40s} {med(pull):7.3f} s {gb / med(pull):6.2f} GB/s")
        report.row(method=name, seconds=med(pull), gbps=gb / med(pull), raw_seconds=med(raw))
        r = report.ratio(f"tcp_pull_{key}_vs_recv_into_{args.gib:g}gib", [f / p for f, p in zip(raw, pull)],
                         "rlmesh GB/s / recv_into GB/s")
        if key == "swap":
            report.target(f"tcp_pull_vs_recv_into_{args.gib:g}gib", r.median, 0.9, at_most=False)
    report.write(args.json)


if __name__ == "__main__":
    main()
