"""The same GRPO step at 1, 2 (and 4) trainer ranks: tokens/s, scaling efficiency, memory per rank.

    .venv/bin/python benchmarks/trainer_mesh.py                 # SmolLM2-135M folder, ranks 1,2 (4 if memory allows)
    .venv/bin/python benchmarks/trainer_mesh.py --model random  # the built-in transformer of the same shape
    .venv/bin/python benchmarks/trainer_mesh.py --smoke         # a tiny model, 1 and 2 ranks, one step each
    .venv/bin/python benchmarks/trainer_mesh.py --state         # 2 ranks: checkpoint with a KL reference, LoRA export

Each rank count gets fresh procs (a proc belongs to one process group for its life): proc 0 holds
a buffer that serves the same fixed batch on every call, procs 1..N the trainer mesh
(``trainer_procs``, FSDP2 over gloo, one torch thread per rank as every trainer). Every step is the
same batch of GRPO groups (random token ids, rewards 0/1, behaviour log-probs given), so each rank
count trains exactly the same tokens; the controller times each ``train`` call (sample, hand-off,
forward/backward, optimizer, the publish: every rank its part, or with ``--publish gathered`` the
gather of the full weights and rank 0's publish), after ``--warmup``
untimed steps. The split per rank and the bytes each rank holds come from the run's ``train_ranks``
rows; each rank's resident memory (now and peak, ``VmRSS``/``VmHWM``) from ``/proc``.

``--state`` measures what a two-rank mesh of the real model writes and holds outside a step: the
bytes and seconds of a sharded checkpoint per rank with a KL reference that is the model folder
(not saved) and one a warm start would have made (saved, a shard per rank), and the peak RSS of each
rank above its RSS before, during the save and during a LoRA export (``/proc/self/clear_refs`` resets
the peak first). Run it against an older checkout (``PYTHONPATH=<checkout>``, with a copy of this
script there) for a before/after in the same session.

Printed as ratios against one rank in one run: tokens/s, scaling efficiency
(``tokens/s at N / (N * tokens/s at 1)``), parameter + optimizer bytes per rank (FSDP2: about 1/N),
peak RSS per rank. ``--json PATH`` writes everything. Fairness: one host, the ranks share its cores
with the buffer and with whatever else runs (the load average is printed before and after); on two
cores, N ranks have at most two cores between them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import banner  # noqa: E402

import rlmesh as rm  # noqa: E402
from rlmesh.rl.algorithms.grpo import GRPOTrainer  # noqa: E402
from rlmesh.rl.backends.base import Completion  # noqa: E402
from rlmesh.rl.buffer import BufferedRollout, SampleResult  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9)
"""SmolLM2-135M's shape in the built-in transformer (it has 3 KV heads and a 1536-wide MLP; this one
has full attention heads and a 4x MLP: 150M parameters against 135M)."""


class FixedBatch(rm.Actor):
    """Serves the same items on every ``sample``, as the replay buffer would (one lease per call)."""

    def __init__(self, items: list[dict]) -> None:
        self.items, self.calls = items, 0

    @rm.endpoint
    def sample(self, batch_size: int, version: int, timeout: float, cursor: int = 0, durable: int = 0) -> SampleResult:
        self.calls += 1
        return SampleResult([BufferedRollout(f"b{self.calls}-{i}", version, item, len(item["completions"]))
                             for i, item in enumerate(self.items)], max_lag=0, lease=self.calls)


def batch(vocab: int, groups: int, group_size: int, prompt_len: int, completion_len: int, seed: int = 0) -> list[dict]:
    """One work item of ``groups`` GRPO groups: random prompts and completions, 0/1 rewards (every group
    informative: each has both), behaviour log-probs given (the step recomputes none)."""
    rng = random.Random(seed)
    completions, rewards = [], []
    for _ in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        for k in range(group_size):
            completions.append(Completion(prompt, [rng.randrange(3, vocab) for _ in range(completion_len)],
                                          [-3.0] * completion_len))
            rewards.append(float(k % 2))
    return [{"completions": completions, "rewards": rewards, "group_size": group_size, "logprobs_exact": True}]


def proc_memory(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def measure(ranks: int, args: argparse.Namespace, items: list[dict], model_config, model_path) -> dict:
    from rlmesh.rl.algorithms.grpo import GRPOTrainer
    from rlmesh.rl.config import GRPOConfig
    from rlmesh.rl.run.placement import call_trainer, trainer_procs

    cfg = GRPOConfig(lr=1e-5, max_groups=args.groups, ranks=ranks, parallel="fsdp", publish=args.publish,
                     checkpoint_dir=None, group_timeout_s=1800)
    with rm.this_host().spawn_procs(per_host={"procs": 1 + ranks}, name=f"bench{ranks}") as procs:
        buffer = procs.slice(procs=0).spawn("batch", FixedBatch, items)
        t0 = time.perf_counter()
        trainer = trainer_procs(procs, 1, ranks).spawn("trainer", GRPOTrainer, cfg, buffer, model_config, model_path,
                                                       weights=f"bench{ranks}", seed=0)
        build_s = time.perf_counter() - t0
        times, tokens = [], []
        for i in range(args.warmup + args.steps):
            t = time.perf_counter()
            m = call_trainer(trainer, "train", 1, 60.0).get(timeout=3600)
            took = time.perf_counter() - t
            assert m.trained, f"{ranks} ranks: step {i} trained nothing"
            if i >= args.warmup:
                times.append(took)
                tokens.append(m.metric("train/tokens"))
        memory = [proc_memory(p) for p in procs.slice(procs=slice(1, 1 + ranks)).pids]
    step_s = sum(times) / len(times)
    return {"ranks": ranks, "build_s": build_s, "step_s": step_s, "step_times_s": times,
            "tokens_per_step": tokens[0], "tokens_per_s": tokens[0] / step_s, "memory": memory}


def per_rank(result: dict, warmup: int) -> list[dict]:
    """The run's ``train_ranks`` rows of one rank count, averaged over its timed steps, with each rank's
    memory from ``/proc``."""
    n = result["ranks"]
    rows = rm.telemetry.query(
        f"SELECT rank, avg(step_s) AS step_s, avg(handoff_s) AS handoff_s, avg(forward_s) AS forward_s, "
        f"avg(backward_s) AS backward_s, avg(optimizer_s) AS optimizer_s, avg(sync_s) AS sync_s, "
        f"avg(publish_s) AS publish_s, max(publish_bytes) AS publish_bytes, max(param_bytes) AS param_bytes, "
        f"max(optim_bytes) AS optim_bytes FROM train_ranks WHERE ranks = {n} AND step > {warmup} "
        f"AND proc LIKE 'bench{n}.%' GROUP BY rank ORDER BY rank").to_pylist()
    for r, (rss, hwm) in zip(rows, result["memory"]):
        r["rss_bytes"], r["rss_peak_bytes"] = rss, hwm
    return rows


class Timed(GRPOTrainer):
    """A GRPO trainer rank that times its own save or export and its peak RSS above the RSS before it."""

    def __init__(self, *a, saved_ref: bool = False, **kw) -> None:
        self.saved_ref = saved_ref
        super().__init__(*a, **kw)

    def setup(self) -> None:
        super().setup()
        if self.saved_ref:  # a reference a warm start made: what a checkpoint must hold
            self.ref_source = "checkpoint"

    @rm.endpoint
    def timed(self, what: str, path: str) -> dict:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        rss = proc_memory(os.getpid())[0]
        t0 = time.perf_counter()
        if what == "save":
            self.save_checkpoint(path)
        else:
            self.export(path)
        took = time.perf_counter() - t0
        return {"rank": self.group.rank if self.group else 0, "s": took, "rss": rss,
                "peak_above": proc_memory(os.getpid())[1] - rss}


def state_bench(args: argparse.Namespace, model_path: str) -> None:
    """``--state``: per-rank bytes, seconds and peak RSS of a checkpoint save and of a LoRA export."""
    import shutil

    from rlmesh.rl.config import GRPOConfig, LoRAConfig
    from rlmesh.rl.run.placement import call_trainer, trainer_procs

    items = batch(49152, 2, 2, args.prompt_len, args.completion_len)
    work = Path(tempfile.mkdtemp(prefix="trainer_mesh_state_"))
    cases = [("save", "KL reference = the model folder", {"kl_coef": 0.1}, {}),
             ("save", "KL reference made by a warm start", {"kl_coef": 0.1}, {"saved_ref": True}),
             ("export", "LoRA r=8 export", {}, {"lora": LoRAConfig(r=8)})]
    print(f"\n{'case':<36} {'rank':>4} {'s':>6} {'bytes written MB':>16} {'peak above RSS MB':>17}")
    try:
        for i, (what, label, cfg_kw, kw) in enumerate(cases):
            cfg = GRPOConfig(lr=1e-5, max_groups=2, ranks=2, parallel="fsdp", checkpoint_dir=None,
                             group_timeout_s=1800, sft_steps=0, **cfg_kw)
            with rm.this_host().spawn_procs(per_host={"procs": 3}, name=f"state{i}") as procs:
                buffer = procs.slice(procs=0).spawn("batch", FixedBatch, items)
                trainer = trainer_procs(procs, 1, 2).spawn("trainer", Timed, cfg, buffer, None, model_path,
                                                           weights=f"state{i}", seed=0, **kw)
                if what == "save":  # one step first: Adam's moments exist, as in any checkpoint after step 1
                    assert call_trainer(trainer, "train", 1, 60.0).get(timeout=3600).trained
                out = work / f"case{i}.dcp" if what == "save" else work / f"case{i}"
                rows = trainer.timed.call(what, str(out)).get(timeout=3600).values()
            for r in sorted(rows, key=lambda r: r["rank"]):
                if what == "save":
                    mine = [out / f"__{r['rank']}_0.distcp"] + ([p for p in out.iterdir() if not p.name.startswith("__")]
                                                               if r["rank"] == 0 else [])
                    written = f"{sum(p.stat().st_size for p in mine) / 2**20:16.1f}"
                else:
                    written = f"{'-':>16}"
                print(f"{label:<36} {r['rank']:>4} {r['s']:>6.2f} {written} {r['peak_above'] / 2**20:>17.0f}",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min), {five:.1f} (5 min)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 (the folder scripts/setup_model.sh builds), "
                                                        "random (the built-in transformer of its shape), or a folder")
    ap.add_argument("--ranks", default="auto", help="comma-separated rank counts; auto: 1,2 and 4 if memory allows")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--completion-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--publish", default="sharded", choices=("sharded", "gathered"),
                    help="trainer.publish: every rank its part, or rank 0 the gathered whole")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="a tiny built-in model, ranks 1,2, one timed step")
    ap.add_argument("--state", action="store_true", help="2 ranks of the model folder: checkpoint bytes, seconds "
                                                         "and peak RSS per rank with a KL reference; a LoRA export")
    args = ap.parse_args()

    from rlmesh.rl.models import TransformerConfig

    model_config, model_path, vocab = None, None, SMOLLM2["vocab_size"]
    if args.smoke:
        args.ranks, args.steps, args.warmup = "1,2", 1, 1
        model_config = TransformerConfig(vocab_size=64, max_seq_len=64, d_model=32, n_layers=2, n_heads=4)
        vocab, name = 64, "tiny built-in transformer (smoke)"
    elif args.model == "random":
        model_config = TransformerConfig(max_seq_len=args.prompt_len + args.completion_len, **SMOLLM2)
        name = "built-in transformer of SmolLM2-135M's shape, random weights"
    else:
        model_path = args.model if args.model != "smollm2" else subprocess.run(
            ["bash", str(ROOT / "scripts" / "setup_model.sh")], capture_output=True, text=True,
            check=True).stdout.strip().splitlines()[-1]
        name = model_path
    if args.ranks == "auto":
        need = 4 * 2 * 2**30  # four ranks of a 135M model: about 2 GiB each at their peak (the full model at build)
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        args.ranks = "1,2,4" if avail > 2 * need else "1,2"
    counts = [int(x) for x in args.ranks.split(",")]
    if args.state:
        assert model_path is not None, "--state needs a model folder (--model smollm2 or a path)"
        banner("trainer mesh: checkpoint and export of 2 ranks (FSDP2, gloo, CPU)", "torch", "transformers")
        print(f"# model: {name}\n# load at start: {load()}")
        state_bench(args, model_path)
        print(f"# load at end: {load()}")
        return

    banner("trainer mesh: the same GRPO step at 1..N ranks (FSDP2, gloo, CPU)", "torch", "transformers")
    print(f"# model: {name}")
    print(f"# step: {args.groups} groups x {args.group_size} completions, prompt {args.prompt_len} + completion "
          f"{args.completion_len} tokens; {args.warmup} untimed + {args.steps} timed steps per rank count")
    print(f"# load at start: {load()}")
    items = batch(vocab, args.groups, args.group_size, args.prompt_len, args.completion_len)
    runs = Path(tempfile.mkdtemp(prefix="trainer_mesh_bench_"))
    os.environ["RLMESH_RUNS_DIR"] = str(runs)
    rm.telemetry.start_run(config={"benchmark": "trainer_mesh"})
    results = []
    try:
        for n in counts:
            results.append(measure(n, args, items, model_config, model_path))
            print(f"#   {n} rank(s): {results[-1]['step_s']:.2f} s a step", flush=True)
        rm.telemetry.flush()
        for r in results:
            r["per_rank"] = per_rank(r, args.warmup)
    finally:
        rm.telemetry.end_run()
    print(f"# load at end: {load()}")
    base = results[0]

    def held(r: dict) -> int:
        return max(p["param_bytes"] + p["optim_bytes"] for p in r["per_rank"])

    def peak(r: dict, first: bool) -> int | None:
        rows = r["per_rank"][:1] if first else r["per_rank"][1:]
        return max((p["rss_peak_bytes"] for p in rows), default=None)

    print(f"\n{'ranks':>5} {'step s':>7} {'tokens/s':>9} {'vs 1':>5} {'effic.':>6} {'held MB/rank':>12} {'vs 1':>5} "
          f"{'peak RSS MB r0':>14} {'vs 1':>5} {'others':>7} {'vs 1':>5} {'fwd':>6} {'bwd':>6} {'opt':>5} {'publish':>7}")
    for r in results:
        p0, others = r["per_rank"][0], peak(r, False)
        r["scaling_efficiency"] = r["tokens_per_s"] / (r["ranks"] * base["tokens_per_s"])
        r["held_vs_1"] = held(r) / held(base)
        r["peak_rss_rank0_vs_1"] = peak(r, True) / peak(base, True)
        r["peak_rss_others_vs_1"] = others / peak(base, True) if others else None

        def f(key: str, width: int) -> str:
            v = p0.get(key)
            return f"{v:>{width}.2f}" if isinstance(v, float) else f"{'-':>{width}}"

        print(f"{r['ranks']:>5} {r['step_s']:>7.2f} {r['tokens_per_s']:>9.1f} {r['tokens_per_s'] / base['tokens_per_s']:>5.2f} "
              f"{r['scaling_efficiency']:>6.2f} {held(r) / 2**20:>12.1f} {r['held_vs_1']:>5.2f} "
              f"{peak(r, True) / 2**20:>14.0f} {r['peak_rss_rank0_vs_1']:>5.2f} "
              f"{others / 2**20 if others else 0:>7.0f} {r['peak_rss_others_vs_1'] or 0:>5.2f} "
              f"{f('forward_s', 6)} {f('backward_s', 6)} {f('optimizer_s', 5)} {f('publish_s', 7)}")
    print("(held: parameters + optimizer state one rank holds, from train_ranks; peak RSS: VmHWM of rank 0 (which, "
          "with --publish gathered, also gathers and publishes the full weights) and the largest of the others; fwd/bwd/opt/publish: rank 0's "
          "seconds a step)")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": name, "args": vars(args), "results": results}, indent=1))
    print(json.dumps({"ranks": [r["ranks"] for r in results], "tokens_per_s": [round(r["tokens_per_s"], 2)
                      for r in results], "efficiency": [round(r["scaling_efficiency"], 3) for r in results]}))


if __name__ == "__main__":
    main()
