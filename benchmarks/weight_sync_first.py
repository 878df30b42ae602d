"""The first weight version vs later ones: publish + pull by a reader in another process.

Claim (issue 40): the first version, ``reserve()`` included, reaches a reader within 1.5x the time
of a later one. :meth:`rlmesh.weights.Publisher.reserve` creates the shared-memory slots at once and
then allocates their pages on a thread; the first publish stops that thread wherever it got to and
writes the rest of its slot with ``pwrite``.

Protocol: the ~300-tensor state_dict of ``benchmarks/weight_sync.py``, published as versions
1..``--versions`` by a fresh Publisher, each pulled (``pull_into`` a pre-allocated target,
``--transport``) by one reader process before the next is published. Three publishers a round, the
order rotating round by round:

- ``plain``: no ``reserve()``; a first training step (``--step-s`` of matmuls, a fixed amount of
  work calibrated once), then version 1.
- ``back2back``: ``reserve()``, the reader's :meth:`rlmesh.weights.Subscriber.prepare` (as a
  generator's ``__init__`` does), then version 1 at once: the page population has no time to run.
  The worst case; ``reserve()`` and ``prepare()`` are counted.
- ``overlap``: ``reserve()`` when the trainer starts, then the same first step (the pages populate
  meanwhile), ``prepare()``, then version 1. Counted: ``reserve()`` + ``prepare()`` + what the step
  took beyond the plain publisher's step in the same round (the populator's cost to the step) +
  version 1's publish + pull.

The ratio per round is that first-version time over the median later publish + pull of the same
publisher (versions 3..). Target: <= 1.5x.

Run: ``python benchmarks/weight_sync_first.py --gib 1`` (``--gib 0.25`` for a quick look; ``--smoke``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner  # noqa: E402
from weight_sync import GiB, Reader, make_sd, setup_env  # noqa: E402  (sets OMP_NUM_THREADS=1, RLMESH_TELEMETRY=0)


class Step:
    """A stand-in for the trainer's first step: a fixed number of matmuls (calibrated once to last
    about ``seconds``), so that a step slowed by the page population shows as a longer step."""

    def __init__(self, seconds: float):
        import torch

        self.a = torch.randn(384, 384)
        self.n = 0
        if seconds > 0:
            t0, k = time.perf_counter(), 20
            self._run(k)
            self.n = max(1, int(k * seconds / max(time.perf_counter() - t0, 1e-6)))

    def _run(self, k: int) -> None:
        x = self.a
        for _ in range(k):
            x = (x @ self.a).tanh_()

    def __call__(self) -> float:
        t0 = time.perf_counter()
        self._run(self.n)
        return time.perf_counter() - t0


MODES = ("plain", "back2back", "overlap")


def one(name: str, sd: dict, reader: Reader, versions: int, transport: str, mode: str, step: Step) -> dict:
    from rlmesh.weights import Publisher

    out: dict = {"reserve_s": 0.0, "prepare_s": 0.0, "step_s": None, "publish": [], "total": []}
    with Publisher(name) as pub:
        if mode != "plain":
            t0 = time.perf_counter()
            pub.reserve(sd, wait=True)  # returns once the slots exist; their pages populate on its thread
            out["reserve_s"] = time.perf_counter() - t0
        if mode != "back2back":
            out["step_s"] = step()
        if mode != "plain":
            # the generator is made while the trainer builds: its Subscriber.prepare() maps the reserved slots
            reader.send(op="prepare", transport=transport, name=name)
            out["prepare_s"] = reader.recv()["seconds"]
        for v in range(1, versions + 1):
            t0 = time.perf_counter()
            pub.publish(sd, version=v)
            t1 = time.perf_counter()
            reader.send(op="pull", transport=transport, version=v, name=name)
            assert reader.recv()["version"] == v
            out["publish"].append(t1 - t0)
            out["total"].append(time.perf_counter() - t0)
    reader.send(op="forget", name=name)  # one publisher's staging buffer at a time in the reader, not all of them
    reader.recv()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--transport", nargs="+", default=["shm", "tcp"], choices=("shm", "tcp"))
    ap.add_argument("--rounds", type=int, default=2, help="the three publishers, order rotating")
    ap.add_argument("--step-s", type=float, default=1.0, help="the first training step the pages populate under")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.gib, args.versions, args.rounds, args.step_s = 1 / 64, 3, 1, 0.05
    banner("the first weight version (reserve() included) against later ones", "torch")
    report = Report("weight_sync_first", smoke=args.smoke, args=vars(args))
    total = int(args.gib * GiB)
    setup_env()
    sd = make_sd(total, fill=True)
    step = Step(args.step_s)
    reader = Reader(total, dict(os.environ))
    try:
        for transport in args.transport:
            print(f"\n{total / GiB:.3f} GiB, {len(sd)} tensors, transport {transport}, step {step.n} matmuls")
            print(f"{'publisher':<10}{'reserve s':>10}{'prepare s':>10}{'step s':>8}{'v1 publish':>11}{'v1 +pull':>10}"
                  f"{'v2 +pull':>10}{'later +pull':>12}{'v1 / later':>11}")
            ratios: dict[str, list[float]] = {m: [] for m in MODES}
            for i in range(args.rounds):
                order = MODES[i % 3:] + MODES[: i % 3]
                res = {m: one(f"first{transport}{i}{m[0]}", sd, reader, args.versions, transport, m, step)
                       for m in order}
                for m in MODES:
                    r = res[m]
                    later = statistics.median(r["total"][2:])
                    slowed = max(0.0, r["step_s"] - res["plain"]["step_s"]) if m == "overlap" else 0.0  # never a credit
                    first = r["total"][0] + r["reserve_s"] + r["prepare_s"] + slowed
                    ratios[m].append(first / later)
                    st = "—" if r["step_s"] is None else f"{r['step_s']:.2f}"
                    print(f"{m:<10}{r['reserve_s']:>10.2f}{r['prepare_s']:>10.2f}{st:>8}{r['publish'][0]:>11.2f}"
                          f"{r['total'][0]:>10.2f}{r['total'][1]:>10.2f}{later:>12.2f}{first / later:>10.2f}x",
                          flush=True)
                    report.row(transport=transport, publisher=m, reserve_s=r["reserve_s"], prepare_s=r["prepare_s"],
                               step_s=r["step_s"], v1_publish_s=r["publish"][0], v1_total_s=r["total"][0],
                               v2_total_s=r["total"][1], later_total_s=later)
            report.ratio(f"first_vs_later_plain_{transport}", ratios["plain"], "v1 publish + pull / later")
            rb = report.ratio(f"first_vs_later_back2back_{transport}", ratios["back2back"],
                              "reserve + prepare + v1 publish + pull, back to back / later")
            ro = report.ratio(f"first_vs_later_overlap_{transport}", ratios["overlap"],
                              "reserve + prepare + step slowdown + v1 publish + pull / later")
            report.target(f"first_version_back2back_{transport}", rb.median, 1.5, note="reserve() right before")
            report.target(f"first_version_overlap_{transport}", ro.median, 1.5, note="reserve() at trainer start")
    finally:
        reader.send(op="quit")
        reader.p.wait(timeout=30)
    report.write(args.json)


if __name__ == "__main__":
    main()
