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

Run: ``python benchmarks/weight_sync_first.py --gib 1`` (``--gib 0.25`` for a quick look).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weight_sync import GiB, Reader, make_sd  # noqa: E402  (sets OMP_NUM_THREADS=1, RLMESH_TELEMETRY=0)


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
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--transport", default="shm", choices=("shm", "tcp"))
    ap.add_argument("--rounds", type=int, default=2, help="plain and reserved publishers, alternated")
    args = ap.parse_args()
    from rlmesh.transport import Authenticator

    total = int(args.gib * GiB)
    tmp = tempfile.mkdtemp(prefix="rlmesh-bench-")
    os.environ.update(RLMESH_WEIGHTS_DIRECTORY=tmp, RLMESH_SECRET=os.environ.get("RLMESH_SECRET")
                      or Authenticator.new_secret().hex(), RLMESH_JOB_ID=f"bench{os.getpid()}")
    sd = make_sd(total, fill=True)
    reader = Reader(total, dict(os.environ))
    print(f"# first weight version vs later: {total / GiB:.2f} GiB, {len(sd)} tensors, transport {args.transport}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'publisher':<10}{'reserve s':>10}{'prepare s':>10}{'v1 publish':>11}{'v1 +pull':>10}{'v2 +pull':>10}"
          f"{'later +pull':>12}{'v1 / later':>11}")
    try:
        for i in range(args.rounds):
            for reserve in (False, True):
                r = one(f"first{i}{'r' if reserve else 'p'}", sd, reader, args.versions, args.transport, reserve)
                later = statistics.median(r["total"][2:])
                res = "—" if r["reserve_s"] is None else f"{r['reserve_s']:.2f}"
                prep = "—" if r["prepare_s"] is None else f"{r['prepare_s']:.2f}"
                print(f"{'reserved' if reserve else 'plain':<10}{res:>10}{prep:>10}{r['publish'][0]:>11.2f}"
                      f"{r['total'][0]:>10.2f}{r['total'][1]:>10.2f}{later:>12.2f}{r['total'][0] / later:>10.2f}x",
                      flush=True)
    finally:
        reader.send(op="quit")
        reader.p.wait(timeout=30)
    print("target: v1 / later <= 1.5x (with reserve, called by the trainer while its optimiser builds)")


if __name__ == "__main__":
    main()
