"""Agentic rollouts: throughput with slow tools, generation saved by partial rollouts, and the
calculator's held-out accuracy with and without the tool on the same budget.

Claims it reproduces (docs/agentic.md, "Results"):

1. **Throughput.** Model tokens/s of multi-turn episodes whose tool takes 0, 10 and 100 ms,
   against single-turn generation of the same number of model tokens per episode, re-measured
   beside each latency's runs on the same model (target: >= 0.8x at 10 ms). Three variants,
   interleaved rep by rep: ``lockstep`` (one batch of ``--episodes`` moves turn by turn, with and
   without the prefix cache) and ``cohorts`` (``--cohorts`` batches in flight, generation calls
   of one batch each, so one generates while the others' tools run: ``generator.max_batch``).
   Environments run in this process on a thread pool
   (:func:`rlmesh.rl.agentic.episodes.run_episodes`); every turn is ``--turn-tokens`` tokens
   (no EOS); every turn but the last then calls the tool (the last is the answer, scored without one).
2. **Partial rollouts.** With a weight update every ``--update-every`` generation calls, the share
   of model tokens that discarding interrupted episodes would throw away (what continuing them
   with the new weights saves).
3. **Tools vs no tools.** The same warm start and GRPO budget on 2-digit multiplication, with the
   calculator and without it: greedy held-out accuracy.

Run: ``python benchmarks/agentic.py`` (``--episodes 64 --turns 3 --turn-tokens 8 --reps 3 --cohorts 2
--grpo-steps 20``; ``--skip partial tools`` for the throughput alone). Prints the spread over reps and the host load.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("RLMESH_TELEMETRY", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._common import Report, add_common_args, banner  # noqa: E402
from rlmesh.rl.agentic.calculator import CalculatorEnv, MultiplicationTask  # noqa: E402
from rlmesh.rl.agentic.env_actor import LocalEnvClient  # noqa: E402
from rlmesh.rl.agentic.episodes import EpisodeLimits, run_episodes  # noqa: E402
from rlmesh.rl.agentic.protocol import StepResult, TextEnv  # noqa: E402
from rlmesh.rl.agentic.training import heldout_accuracy, sft_on_demonstrations, train_grpo  # noqa: E402
from rlmesh.rl.backends.base import SamplingParams  # noqa: E402
from rlmesh.rl.backends.torch_backend import TorchBackend  # noqa: E402
from rlmesh.rl.models.transformer import Transformer, TransformerConfig  # noqa: E402


class SleepToolEnv(TextEnv):
    """``turns`` model turns an episode: every turn but the last is a tool call that sleeps ``latency_s``
    and answers ``(42)``; the last turn is the answer, scored without a tool (as the calculator's is)."""

    def __init__(self, latency_s: float, turns: int) -> None:
        self.latency_s, self.turns, self.n = latency_s, turns, 0

    def reset(self, task: object) -> str:
        return "12*34="

    def step(self, model_text: str) -> StepResult:
        self.n += 1
        if self.n >= self.turns:
            return StepResult("", 0.0, True)
        if self.latency_s:
            time.sleep(self.latency_s)
        return StepResult("(42)", 0.0, False)


def throughput(args: argparse.Namespace, report: Report) -> None:
    task = MultiplicationTask(2, 2)
    tok = task.tokenizer
    cfg = TransformerConfig(vocab_size=tok.vocab_size, max_seq_len=8 + args.turns * (args.turn_tokens + 4) + 4,
                            d_model=args.d_model, n_layers=args.n_layers, n_heads=4)
    torch.manual_seed(0)
    model = Transformer(cfg)
    backend = TorchBackend(model, eos_id=None, pad_id=tok.pad_id, seed=0)  # no EOS: fixed-length turns
    cold = TorchBackend(model, eos_id=None, pad_id=tok.pad_id, seed=0, prefix_cache_mb=0)
    prompt = [tok.BOS] + tok.encode("12*34=")
    limits = EpisodeLimits(max_turns=args.turns, max_tokens=args.turns * (args.turn_tokens + 4), turn_tokens=args.turn_tokens)
    tokens = args.turns * args.turn_tokens
    print(f"\n## throughput: batches of {args.episodes} episodes x {args.turns} turns x {args.turn_tokens} tokens "
          f"(d_model {args.d_model}, {args.n_layers} layers), model tokens/s, median [min-max] of {args.reps}; "
          "the single-turn baseline is re-measured beside each latency's runs")
    # Variants: name -> (backend, episodes in flight, max_batch). `lockstep`: one batch of episodes moves
    # turn by turn together, the model idle while their tools run. `cohorts`: `--cohorts` batches in
    # flight, calls of one batch each, so one cohort generates while the others' tools run.
    variants = {"lockstep, prefix cache": (backend, args.episodes, None),
                "lockstep, no cache": (cold, args.episodes, None),
                f"{args.cohorts} cohorts, prefix cache": (backend, args.cohorts * args.episodes, args.episodes)}
    for ms in args.latencies_ms:
        single: list[float] = []
        rates: dict[str, list[float]] = {name: [] for name in variants}
        # One environment client per variant for all its reps, as a generator holds one for its run:
        # its thread pool is started by an untimed first round, not inside the timed ones.
        envs = {name: LocalEnvClient(lambda: SleepToolEnv(ms / 1000, args.turns), max_workers=n)
                for name, (_, n, _) in variants.items()}
        for rep in range(-1, args.reps):  # everything interleaved, so load drifts hit each alike; rep -1 warms up
            t0 = time.perf_counter()
            cold.generate([prompt] * args.episodes, SamplingParams(max_tokens=tokens))
            if rep >= 0:
                single.append(args.episodes * tokens / (time.perf_counter() - t0))
            for name, (be, n, max_batch) in variants.items():
                t0 = time.perf_counter()
                trajs = run_episodes(be, envs[name], [(f"e{rep}-{i}", None) for i in range(n)], tok.encode,
                                     limits, SamplingParams(), prompt_prefix=[tok.BOS], decode=tok.decode,
                                     max_batch=max_batch)
                if rep >= 0:
                    rates[name].append(sum(t.model_tokens for t in trajs) / (time.perf_counter() - t0))
        for env in envs.values():
            env.shutdown()
        base = statistics.median(single)
        print(f"tool {ms:4.0f} ms: single-turn, {tokens} tokens in one call {base:8.0f}  [{min(single):.0f}-{max(single):.0f}]")
        for name, r in rates.items():
            med = statistics.median(r)
            print(f"tool {ms:4.0f} ms: multi-turn, {name:26s} {med:8.0f}  [{min(r):.0f}-{max(r):.0f}]  "
                  f"ratio {med / base:.2f}x")
            key = name.replace(", ", "_").replace(" ", "_")
            ratio = report.ratio(f"tool_{ms:g}ms_{key}", [x / b for x, b in zip(r, single)],
                                 "multi-turn model tokens/s / single-turn tokens/s, same rep")
            if ms == 10 and "cohorts" in name:
                report.target("tool_10ms_throughput", ratio.median, 0.8, at_most=False)
            report.row(tool_ms=ms, variant=name, tokens_per_s=r, single_turn_tokens_per_s=single)
    pc = backend.prefixes
    print(f"prefix cache: {pc.hits} prompt tokens found in it, {pc.misses} not")


def partial_rollouts(args: argparse.Namespace) -> None:
    task = MultiplicationTask(2, 2)
    tok = task.tokenizer
    cfg = TransformerConfig(vocab_size=tok.vocab_size, max_seq_len=8 + args.turns * (args.turn_tokens + 4) + 4,
                            d_model=args.d_model, n_layers=2, n_heads=4)
    backend = TorchBackend(Transformer(cfg), eos_id=None, pad_id=tok.pad_id, seed=0)
    limits = EpisodeLimits(max_turns=args.turns, max_tokens=args.turns * (args.turn_tokens + 4), turn_tokens=args.turn_tokens)
    calls = [0]

    def version() -> int:  # a weight update lands every `update_every` generation calls
        calls[0] += 1
        return calls[0] // args.update_every

    env = LocalEnvClient(lambda: SleepToolEnv(0.0, args.turns))
    # episodes start in waves, as a generator refills its slots: a wave of 8 every generation call
    trajs = []
    for w in range(args.episodes // 8):
        trajs += run_episodes(backend, env, [(f"w{w}e{i}", None) for i in range(8)], tok.encode, limits,
                              SamplingParams(), version=version, prompt_prefix=[tok.BOS], decode=tok.decode)
        calls[0] += w % 2  # stagger so updates fall inside episodes, not only between waves
    total = sum(t.model_tokens for t in trajs)
    spanning = [t for t in trajs if len({s.policy_version for s in t.segments}) > 1]
    lost = sum(t.model_tokens for t in spanning)
    print(f"\n## partial rollouts: a weight update every {args.update_every} generation calls, {len(trajs)} episodes")
    print(f"episodes spanning an update: {len(spanning)}/{len(trajs)}; model tokens discarding would throw away and "
          f"regenerate: {lost}/{total} ({lost / max(total, 1):.0%}); continuing with new weights saves them")


def tools_vs_none(args: argparse.Namespace) -> None:
    task = MultiplicationTask(2, 2)
    limits = EpisodeLimits(max_turns=3, max_tokens=task.max_episode_tokens(), turn_tokens=10)
    heldout = task.sample(300, random.Random(1), "heldout")
    print(f"\n## calculator: {args.sft_steps} SFT steps, {args.grpo_steps} GRPO steps of 16 tasks x 8 episodes; "
          "greedy held-out accuracy on 300 tasks")
    for tools in (True, False):
        torch.manual_seed(0)
        model = Transformer(TransformerConfig(vocab_size=task.tokenizer.vocab_size,
                                              max_seq_len=task.max_prompt_len() + limits.max_tokens,
                                              d_model=64, n_layers=2, n_heads=4))
        t0 = time.perf_counter()
        sft_on_demonstrations(model, task, args.sft_steps, tool_fraction=0.35 if tools else 0.0, batch_size=32, lr=3e-3)
        backend = TorchBackend(model, eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id, seed=0)
        env = LocalEnvClient(CalculatorEnv, {"tools": tools})
        model.eval()
        start, _ = heldout_accuracy(backend, env, task, heldout, limits)
        train_grpo(model, backend, env, task, args.grpo_steps, limits)
        acc, use = heldout_accuracy(backend, env, task, heldout, limits)
        print(f"{'with the calculator   ' if tools else 'without (no tool)     '} after SFT {start:.2f} -> after GRPO "
              f"{acc:.2f} (tool used in {use:.0%} of episodes), {time.perf_counter() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--latencies-ms", type=float, nargs="+", default=[0, 10, 100])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cohorts", type=int, default=2, help="batches of episodes in flight in the cohorts variant")
    ap.add_argument("--update-every", type=int, default=4)
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--grpo-steps", type=int, default=20)
    ap.add_argument("--skip", nargs="*", default=[], choices=["throughput", "partial", "tools"])
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:  # throughput at one latency and the partial-rollout count; no training
        args.episodes, args.reps, args.latencies_ms, args.skip = 8, 1, [10.0], ["tools"]
    torch.set_num_threads(1)
    banner("agentic rollouts", "torch")
    report = Report("agentic", smoke=args.smoke, args=vars(args))
    print(f"# load average at start: {os.getloadavg()[0]:.1f}")
    if "throughput" not in args.skip:
        throughput(args, report)
    if "partial" not in args.skip:
        partial_rollouts(args)
    if "tools" not in args.skip:
        tools_vs_none(args)
    print(f"# load average at end: {os.getloadavg()[0]:.1f}")
    report.write(args.json)


if __name__ == "__main__":
    main()
