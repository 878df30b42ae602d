"""Weight-sync reader memory: what a reader process holds, round by round, per transport and target.

Claim (issue 37): a reader of a version of N bytes holds its target plus at most about one more
version, and holds no more after the hundredth version than after the second. ``benchmarks/
weight_sync.py`` once showed readers of a 1 GiB version at 7.6-8.5 GiB RSS; that figure was its
reader process, not a reader: it kept a state_dict target, an ``nn.Module`` target and the raw
pyzmq floor's 1 GiB receive buffer at once, plus one Subscriber per (publisher, transport) it had
used, each with what it holds (a TCP staging buffer, or a mapping of every shared-memory slot of
the publisher, counted in RSS as shared).

Protocol: a Publisher in this process; for each transport (shm, tcp) and target kind (a state_dict,
an ``nn.Module``), a fresh reader process allocates its target (zeroed, its pages touched as a
model's are), then for ``--rounds`` rounds this process publishes a version and the reader pulls
it and reports ``/proc/self/status``: ``RssAnon`` (private), ``RssShmem`` (the publisher's slots it
maps: pages that exist once on the host however many readers map them) and ``VmHWM`` (peak RSS).
Printed per reader, in units of the version size:

- "runtime": private memory before the target (the interpreter, torch, rlmesh);
- "held": private memory beyond the runtime and the target after the last round;
- "shared": the slots mapped after the last round;
- "peak": the peak RSS (``VmHWM``, shared pages included) beyond the runtime and the target;
- "MB/round": least-squares slope of private memory over the rounds after the second (0 = bounded).

Run: ``.venv/bin/python benchmarks/reader_memory.py [--gib 1] [--rounds 10]``; ``--smoke`` for a
64 MiB version and 4 rounds. It measures, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")  # no spinning OpenMP pools on a shared host
os.environ.setdefault("RLMESH_TELEMETRY", "0")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, banner  # noqa: E402

MiB = 1 << 20
TENSORS = 64


def memory() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def state(total: int, value: float) -> dict[str, torch.Tensor]:
    return {f"l{i}.w": torch.full((total // TENSORS // 4,), value) for i in range(TENSORS)}


def reader_main(total: int, transport: str, kind: str) -> None:
    """One reader: its runtime, then its target, then one pull per line of stdin (the version to pull)."""
    from rlmesh.weights import Subscriber

    sub = Subscriber("readermem", transport)
    print(json.dumps(memory()), flush=True)
    sd = state(total, 0.0)
    target: object = sd
    if kind == "module":
        module = torch.nn.Module()
        for k, t in sd.items():
            layer, leaf = k.split(".")
            module.add_module(layer, torch.nn.Module())
            getattr(module, layer).register_buffer(leaf, t)
        target, sd = module, {}
    print(json.dumps(memory()), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        sub.pull_into(target, min_version=int(line), timeout=120)
        print(json.dumps(memory()), flush=True)
    sub.close()


def slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="a 64 MiB version, 4 rounds")
    ap.add_argument("--json", default="", help="write the rows here too")
    ap.add_argument("--reader", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        return reader_main(int(args.reader[0]), args.reader[1], args.reader[2])
    if args.smoke:
        args.gib, args.rounds = 1 / 16, 4
    from rlmesh.transport import Authenticator
    from rlmesh.weights import Publisher

    torch.set_num_threads(1)
    total = int(args.gib * (1 << 30)) // (TENSORS * 4) * (TENSORS * 4)
    os.environ.update(RLMESH_WEIGHTS_DIRECTORY=tempfile.mkdtemp(prefix="rlmesh-readermem-"),
                      RLMESH_SECRET=os.environ.get("RLMESH_SECRET") or Authenticator.new_secret().hex(),
                      RLMESH_JOB_ID=f"readermem{os.getpid()}")
    banner("weight-sync reader memory", "torch")
    report = Report("reader_memory", smoke=args.smoke, args=vars(args))
    sd = state(total, 0.0)
    rows = []
    version = 0
    with Publisher("readermem") as pub:
        for transport in ("shm", "tcp"):
            for kind in ("dict", "module"):
                p = subprocess.Popen([sys.executable, __file__, "--reader", str(total), transport, kind],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                assert p.stdin is not None and p.stdout is not None
                runtime = json.loads(p.stdout.readline())
                with_target = json.loads(p.stdout.readline())
                per_round = []
                for _ in range(args.rounds):
                    version += 1
                    for t in sd.values():
                        t.fill_(version)
                    pub.publish(sd, version=version)
                    p.stdin.write(f"{version}\n")
                    p.stdin.flush()
                    line = p.stdout.readline()
                    if not line:
                        raise RuntimeError(f"the {transport} reader died at version {version}")
                    per_round.append(json.loads(line))
                p.stdin.write("\n")
                p.stdin.flush()
                p.wait(timeout=60)
                base = runtime["RssAnon"] + total  # the runtime and the target
                last = per_round[-1]
                rows.append({
                    "transport": transport, "target": kind, "version_bytes": total,
                    "runtime_mb": runtime["RssAnon"] / MiB, "target_mb": (with_target["RssAnon"] - runtime["RssAnon"]) / MiB,
                    "held_x": (last["RssAnon"] - base) / total,
                    "peak_x": (max(r["VmHWM"] for r in per_round) - base - runtime["RssFile"]) / total,
                    "shared_x": last["RssShmem"] / total,
                    "mb_per_round": slope([r["RssAnon"] / MiB for r in per_round[2:]]),
                    "private_mb": [round(r["RssAnon"] / MiB) for r in per_round],
                })
    print(f"\nreader memory, a version of {total / MiB:.0f} MiB in {TENSORS} tensors, {args.rounds} rounds "
          f"(load {os.getloadavg()[0]:.1f}); held, shared and peak in versions, beyond the runtime and the target")
    print(f"{'transport':9s} {'target':7s} {'runtime MB':>10s} {'held':>6s} {'peak':>6s} {'shared':>7s} {'MB/round':>9s}")
    for r in rows:
        print(f"{r['transport']:9s} {r['target']:7s} {r['runtime_mb']:10.0f} {r['held_x']:6.2f} {r['peak_x']:6.2f} "
              f"{r['shared_x']:7.2f} {r['mb_per_round']:9.2f}")
        # the floor: what a reader cannot do without, its runtime and its target
        report.ratio(f"peak_vs_runtime_and_target_{r['transport']}_{r['target']}",
                     [1 + r["peak_x"] * total / (r["runtime_mb"] * MiB + total)], "peak RSS / (runtime + target)")
        report.row(**r)
    report.write(args.json)


if __name__ == "__main__":
    main()
