"""The first weight version vs later ones: publish + pull by a reader in another process.

Claim (issue 16, item 3): the first version reaches generators within 1.5x the time of a
later one, because :meth:`rlmesh.weights.Publisher.reserve` (called by the trainer right after
it builds its model) creates the shared-memory slots while the rest of start-up runs.

Protocol: the ~300-tensor state_dict of ``benchmarks/weight_sync.py``, published as versions
1..``--versions`` by a fresh Publisher, each pulled (``pull_into`` a pre-allocated target,
``--transport``) by one reader process before the next is published. Two publishers in the
same run: one plain, one that called ``reserve`` first (its time is printed separately: in a
trainer it overlaps building the optimiser), after which the reader calls
:meth:`rlmesh.weights.Subscriber.prepare`, as a generator's ``__init__`` does (the same-host reader
maps the reserved slots; its time is printed too). Reported: publish s and publish + pull s of
version 1, version 2 (the second slot) and the median of the later ones.

The reserved publisher's first version counts ``reserve()`` and the reader's ``prepare()`` (both on
the way to the first pull when a trainer starts: issue 40); the ratio per round is that sum plus the
v1 publish + pull over the median later publish + pull of the same publisher. Target: <= 1.5x.

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


def one(name: str, sd: dict, reader: Reader, versions: int, transport: str, reserve: bool) -> dict:
    from rlmesh.weights import Publisher

    out: dict = {"reserve_s": None, "prepare_s": None, "publish": [], "total": []}
    with Publisher(name) as pub:
        if reserve:
            t0 = time.perf_counter()
            pub.reserve(sd, wait=True)
            out["reserve_s"] = time.perf_counter() - t0
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
    ap.add_argument("--rounds", type=int, default=2, help="plain and reserved publishers, alternated")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.gib, args.versions, args.rounds = 1 / 64, 3, 1
    banner("the first weight version (reserve() included) against later ones", "torch")
    report = Report("weight_sync_first", smoke=args.smoke, args=vars(args))
    total = int(args.gib * GiB)
    setup_env()
    sd = make_sd(total, fill=True)
    reader = Reader(total, dict(os.environ))
    try:
        for transport in args.transport:
            print(f"\n{total / GiB:.3f} GiB, {len(sd)} tensors, transport {transport}")
            print(f"{'publisher':<10}{'reserve s':>10}{'prepare s':>10}{'v1 publish':>11}{'v1 +pull':>10}{'v2 +pull':>10}"
                  f"{'later +pull':>12}{'v1 / later':>11}")
            ratios: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.rounds):
                for reserve in ((False, True) if i % 2 == 0 else (True, False)):
                    r = one(f"first{transport}{i}{'r' if reserve else 'p'}", sd, reader, args.versions, transport,
                            reserve)
                    later = statistics.median(r["total"][2:])
                    first = r["total"][0] + (r["reserve_s"] or 0.0) + (r["prepare_s"] or 0.0)
                    ratios[reserve].append(first / later)
                    res = "—" if r["reserve_s"] is None else f"{r['reserve_s']:.2f}"
                    prep = "—" if r["prepare_s"] is None else f"{r['prepare_s']:.2f}"
                    print(f"{'reserved' if reserve else 'plain':<10}{res:>10}{prep:>10}{r['publish'][0]:>11.2f}"
                          f"{r['total'][0]:>10.2f}{r['total'][1]:>10.2f}{later:>12.2f}{first / later:>10.2f}x",
                          flush=True)
                    report.row(transport=transport, publisher="reserved" if reserve else "plain",
                               reserve_s=r["reserve_s"], prepare_s=r["prepare_s"], v1_publish_s=r["publish"][0],
                               v1_total_s=r["total"][0], v2_total_s=r["total"][1], later_total_s=later)
            report.ratio(f"first_vs_later_plain_{transport}", ratios[False], "v1 publish + pull / later")
            rr = report.ratio(f"first_vs_later_reserved_{transport}", ratios[True],
                              "reserve + prepare + v1 publish + pull / later")
            report.target(f"first_version_{transport}", rr.median, 1.5)
    finally:
        reader.send(op="quit")
        reader.p.wait(timeout=30)
    report.write(args.json)


if __name__ == "__main__":
    main()
