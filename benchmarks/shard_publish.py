"""Publishing a trainer mesh's weights sharded (every rank its part) against gathered (rank 0 the whole).

    .venv/bin/python benchmarks/shard_publish.py                  # 3 model sizes, 2 ranks (and 4 if memory allows)
    .venv/bin/python benchmarks/shard_publish.py --ranks 2 --rounds 9
    .venv/bin/python benchmarks/shard_publish.py --smoke          # a tiny model, 2 ranks, one round

What is timed is what a user of the run waits for between the end of a train step and a generator
holding the new weights: the controller calls ``publish`` on every rank of an FSDP2 mesh (gloo,
one torch thread per rank, as the trainer runs) and, once every rank answered, ``pull`` on a
generator actor in another proc, which ``pull_into``s its own model (shm, or TCP forced).

- **gathered** (``trainer.publish=gathered``): the version broadcast, the full state dict gathered
  to rank 0 (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``), rank 0's publish;
  the generator pulls from one publisher.
- **sharded** (``trainer.publish=sharded``): the version broadcast, then each rank publishes its
  own FSDP2 shards (:func:`rlmesh.rl.train.publishing.local_pieces`); the generator pulls from
  every rank at once and assembles the whole tensors.

Both run on the same procs, models and readers, alternating which goes first round by round
(:func:`_common.interleave`); the first round of each is untimed (it maps the slots and sizes the
staging buffers). Printed per model size, rank count and transport: median and p90 of the whole
wait, its publish and pull parts, and the ratio gathered / sharded (> 1: sharded is faster), with
the machine, the load before and after, and versions. The ranks and the generator share this
host's cores with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Report, add_common_args, banner, load, median, p90  # noqa: E402

import torch  # noqa: E402

import rlmesh as rm  # noqa: E402
from rlmesh.rl.models import TransformerConfig  # noqa: E402
from rlmesh.rl.models.transformer import Transformer  # noqa: E402
from rlmesh.rl.run.placement import trainer_procs  # noqa: E402
from rlmesh.rl.train.distributed import TrainGroup  # noqa: E402
from rlmesh.rl.train.publishing import local_pieces  # noqa: E402
from rlmesh.weights import Publisher, Subscriber  # noqa: E402
from rlmesh.weights.sharded import ShardPublisher  # noqa: E402

SIZES = {
    "S": TransformerConfig(vocab_size=8192, max_seq_len=64, d_model=256, n_layers=4, n_heads=4),
    "M": TransformerConfig(vocab_size=32768, max_seq_len=64, d_model=512, n_layers=8, n_heads=8),
    "L": TransformerConfig(vocab_size=49152, max_seq_len=64, d_model=576, n_layers=30, n_heads=9),
}
"""Built-in transformers; L has SmolLM2-135M's shape (150M parameters in float32)."""
SMOKE = {"tiny": TransformerConfig(vocab_size=64, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)}


def state_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


class Ranks(rm.Actor):
    """One rank of an FSDP2 mesh: the model of one size at a time, with both publishers of it."""

    def __init__(self, name: str, world: int) -> None:
        torch.set_num_threads(1)
        self.name, self.rank, self.world = name, rm.context().rank, world
        self.group = TrainGroup.form(name, self.rank, world, 1800)
        self.models: dict[str, torch.nn.Module] = {}
        self.gathered: dict[str, Publisher] = {}
        self.shards: dict[str, ShardPublisher] = {}

    @rm.endpoint
    def build(self, key: str, cfg: TransformerConfig) -> None:
        """The model ``key`` (the same weights on every rank), sharded, and both publishers' slots reserved."""
        torch.manual_seed(0)
        model = self.models[key] = self.group.wrap(Transformer(cfg), "fsdp")
        full = self.group.full_state_dict(model)
        if full is not None:
            self.gathered[key] = Publisher(f"{self.name}-{key}-gathered")
            self.gathered[key].reserve(full, wait=True)
        self.shards[key] = ShardPublisher(f"{self.name}-{key}-sharded", self.rank, self.world, self.group.incarnation)
        self.shards[key].reserve(local_pieces(model, self.rank, self.world), wait=True)

    @rm.endpoint
    def forget(self, key: str) -> None:
        """Close model ``key``'s publishers and drop it (its slots go): one size's memory at a time."""
        for pub in (self.gathered.pop(key, None), self.shards.pop(key, None)):
            if pub is not None:
                pub.close()
        self.models.pop(key, None)

    @rm.endpoint
    def publish(self, key: str, mode: str, version: int) -> float:
        """Publish model ``key`` as ``version``, ``gathered`` or ``sharded``; this rank's seconds."""
        t0 = time.perf_counter()
        version = self.group.broadcast_int(version)  # the trainer's version hand-out, in both modes
        model = self.models[key]
        if mode == "gathered":
            full = self.group.full_state_dict(model)
            if full is not None:
                self.gathered[key].publish(full, version)
        else:
            self.shards[key].publish(local_pieces(model, self.rank, self.world), version)
        return time.perf_counter() - t0


class Generator(rm.Actor):
    """A generator's side: the model of one size at a time, pulled into in place."""

    def __init__(self, name: str) -> None:
        torch.set_num_threads(1)
        self.name = name
        self.models: dict[str, torch.nn.Module] = {}
        self.subs: dict[tuple[str, str, str], Subscriber] = {}

    @rm.endpoint
    def build(self, key: str, cfg: TransformerConfig) -> None:
        self.models[key] = Transformer(cfg)

    @rm.endpoint
    def forget(self, key: str) -> None:
        """Close model ``key``'s readers (their maps and staging buffers go) and drop it."""
        for k in [k for k in self.subs if k[0] == key]:
            self.subs.pop(k).close()
        self.models.pop(key, None)

    @rm.endpoint
    def pull(self, key: str, mode: str, transport: str, version: int) -> float:
        sub = self.subs.get((key, mode, transport))
        if sub is None:
            sub = self.subs[(key, mode, transport)] = Subscriber(f"{self.name}-{key}-{mode}", transport)
        t0 = time.perf_counter()
        got = sub.pull_into(self.models[key], min_version=version, timeout=300)
        assert got == version, (got, version)
        return time.perf_counter() - t0


def run(world: int, sizes: dict[str, TransformerConfig], transports: list[str], rounds: int) -> list[dict]:
    name = f"shards{world}"
    out = []
    with rm.this_host().spawn_procs(per_host={"procs": 1 + world}, name=name) as procs:
        gen = procs.slice(procs=0).spawn("generator", Generator, name)
        mesh = trainer_procs(procs, 1, world).spawn("ranks", Ranks, name, world)
        version = 0

        def once(key: str, mode: str, transport: str) -> tuple[float, float, float]:
            nonlocal version
            version += 1
            t0 = time.perf_counter()
            mesh.publish.call(key, mode, version).get(timeout=600)
            t1 = time.perf_counter()
            gen.pull.call_one(key, mode, transport, version).get(timeout=600)
            t2 = time.perf_counter()
            return t2 - t0, t1 - t0, t2 - t1

        for key in sizes:
            nbytes = state_bytes(Transformer(sizes[key]))
            mesh.build.call(key, sizes[key]).get(timeout=1800)
            gen.build.call_one(key, sizes[key]).get(timeout=600)
            for transport in transports:
                once(key, "gathered", transport), once(key, "sharded", transport)  # untimed: maps, staging
                got: dict[str, list[tuple[float, float, float]]] = {"gathered": [], "sharded": []}
                for i in range(rounds):  # alternate which goes first, as _common.interleave does
                    order = ("gathered", "sharded") if i % 2 == 0 else ("sharded", "gathered")
                    for mode in order:
                        got[mode].append(once(key, mode, transport))
                row = {"size": key, "bytes": nbytes, "ranks": world, "transport": transport, "rounds": rounds}
                for mode, xs in got.items():
                    for j, part in enumerate(("total", "publish", "pull")):
                        vals = [x[j] for x in xs]
                        row[f"{mode}_{part}_median"], row[f"{mode}_{part}_p90"] = median(vals), p90(vals)
                    row[f"{mode}_total_s"] = [x[0] for x in xs]
                row["gathered_over_sharded"] = row["gathered_total_median"] / row["sharded_total_median"]
                out.append(row)
                print(f"#   {key} ({nbytes / 2**20:.0f} MiB), {world} ranks, {transport}: gathered "
                      f"{row['gathered_total_median']:.3f} s, sharded {row['sharded_total_median']:.3f} s "
                      f"(load {load():.1f})", flush=True)
            gen.forget.call_one(key).get(timeout=600)
            mesh.forget.call(key).get(timeout=600)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="S,M,L", help=f"comma-separated, of {','.join(SIZES)}")
    ap.add_argument("--ranks", default="auto", help="comma-separated rank counts; auto: 2, and 4 if memory allows")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds of each mode per cell")
    add_common_args(ap)
    args = ap.parse_args()
    sizes = SMOKE if args.smoke else {k: SIZES[k] for k in args.sizes.split(",")}
    if args.smoke:
        args.ranks, args.rounds = "2", 1
    if args.ranks == "auto":
        biggest = max(state_bytes(Transformer(c)) for c in sizes.values())
        need = 12 * biggest  # 4 ranks building the whole model, both publishers' slots, the gather, the reader
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        args.ranks = "2,4" if avail > need + (4 << 30) else "2"
    banner("trainer mesh weights: sharded publish + pull against gathered (FSDP2, gloo, CPU)", "torch")
    print(f"# sizes: {', '.join(f'{k} {state_bytes(Transformer(c)) / 2**20:.0f} MiB' for k, c in sizes.items())}; "
          f"ranks {args.ranks}; transports {args.transports}; {args.rounds} timed rounds each, interleaved")
    rows: list[dict] = []
    load_start = load()
    for world in (int(x) for x in args.ranks.split(",")):
        rows += run(world, sizes, args.transports.split(","), args.rounds)
    print(f"# load at end: {load():.2f} (1-minute average)")
    print(f"\n{'size':>5} {'MiB':>6} {'ranks':>5} {'via':>4} | {'gathered s (p90)':>17} {'publish':>8} {'pull':>7} | "
          f"{'sharded s (p90)':>16} {'publish':>8} {'pull':>7} | {'gathered/sharded':>16}")
    for r in rows:
        print(f"{r['size']:>5} {r['bytes'] / 2**20:>6.0f} {r['ranks']:>5} {r['transport']:>4} | "
              f"{r['gathered_total_median']:>8.3f} ({r['gathered_total_p90']:.3f}) {r['gathered_publish_median']:>8.3f} "
              f"{r['gathered_pull_median']:>7.3f} | {r['sharded_total_median']:>7.3f} ({r['sharded_total_p90']:.3f}) "
              f"{r['sharded_publish_median']:>8.3f} {r['sharded_pull_median']:>7.3f} | {r['gathered_over_sharded']:>16.2f}")
    print("(medians of the timed rounds, p90 in brackets; publish: every rank done; pull: the generator's pull_into; "
          "gathered/sharded > 1: sharded is faster)")
    report = Report("shard_publish", smoke=args.smoke, args=vars(args), load_start=load_start)
    for r in rows:  # per round: the gathered floor's time over the sharded one's (> 1: sharded is faster)
        report.ratio(f"gathered_over_sharded_{r['size']}_{r['ranks']}r_{r['transport']}",
                     [g / s for g, s in zip(r["gathered_total_s"], r["sharded_total_s"])], "gathered s / sharded s")
        report.row(**r)
    report.write(args.json)
    print(json.dumps({"cells": [[r["size"], r["ranks"], r["transport"], round(r["gathered_over_sharded"], 3)]
                                for r in rows]}))


if __name__ == "__main__":
    main()
