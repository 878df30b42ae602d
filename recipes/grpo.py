"""GRPO on a verifiable synthetic task (multi-digit addition), generators, reward actors and
a trainer in their own procs.

    rlmesh run recipe=grpo_addition                              # ~6 min on 2 CPU cores
    rlmesh run recipe=grpo_addition steps=50 eval.every=10 trainer.sft_steps=50
    rlmesh run recipe=grpo_addition generator=vllm model.path=/models/tiny trainer.sft_steps=0

The loop, top to bottom: the trainer warm-starts (SFT on the task format, standing in for a
pretrained LM) and publishes version 0. The recipe's data generator deals prompts into
work items; each LLM generator samples ``samples_per_prompt`` completions per prompt
through its backend, has a reward actor verify them and hands the scored groups to the
buffer. The trainer takes a batch of fresh groups, runs a GRPO step and publishes; an
evaluator scores greedy answers on held-out prompts (never trained on) every ``eval.every``
steps. Generation runs ahead of training by at most ``buffer.max_policy_lag`` versions.
"""

from __future__ import annotations

import asyncio
import random
import time

import rlmesh as rm
from rlmesh.rl.actors import GRPOTrainer, LLMGenerator, ReplayBuffer, RewardActor
from rlmesh.rl.actors.llm_generator import backend_kwargs_for
from rlmesh.rl.models import TransformerConfig
from rlmesh.rl.placement import place
from rlmesh.rl.recipe_config import GRPORecipeConfig
from rlmesh.rl.report import RunProgress, print_summary, telemetry_counts
from rlmesh.rl.schedule import AsyncWorkScheduler
from rlmesh.rl.tasks import AdditionTask


def make_task(cfg: GRPORecipeConfig) -> AdditionTask:
    """The task's data generator: seeded, with a held-out split disjoint from training."""
    t = cfg.task
    task = AdditionTask(t.min_digits, t.max_digits, t.heldout_fraction, reverse_answer=t.reverse_answer)
    task.name = f"addition_{t.min_digits}-{t.max_digits}"
    return task


def main(cfg: GRPORecipeConfig, launcher: str = "local", trainer_cls: type = GRPOTrainer) -> dict:
    g, m, seed = cfg.generator, cfg.model, cfg.run.seed
    task = make_task(cfg)
    model_config = None if m.path else TransformerConfig(
        vocab_size=task.tokenizer.vocab_size, max_seq_len=task.max_prompt_len + g.max_new_tokens,
        d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads)
    cfg.telemetry.apply()
    run_id = rm.telemetry.start_run(config=cfg)
    n_procs = cfg.proc_meshes()["rl"]
    procs = place(launcher, cfg.launcher).spawn_procs(per_host={"procs": n_procs}, name="rl",
                                                     restart=rm.Restart(max_restarts=cfg.run.max_restarts))
    try:
        # proc 0: buffer + evaluator, proc 1: trainer, then reward actors, then generators
        buffer = procs.slice(procs=0).spawn("buffer", ReplayBuffer, cfg.buffer)
        rewards = procs.slice(procs=slice(2, 2 + cfg.reward.replicas)).spawn("reward", RewardActor, cfg.reward)
        trainer = procs.slice(procs=1).spawn("trainer", trainer_cls, cfg.trainer, buffer, model_config, m.path, task,
                                             g.temperature, task.tokenizer.pad_id, seed=seed)
        backend = backend_kwargs_for(g.backend, task, model_config, m.path, seed)
        evaluator = procs.slice(procs=0).spawn("evaluator", LLMGenerator, g, task, None, rewards, backend)
        gens = procs.slice(procs=slice(2 + cfg.reward.replicas, n_procs)).spawn(
            "generator", LLMGenerator, g, task, buffer, rewards, backend)
        result = asyncio.run(_loop(cfg, task, gens, trainer, evaluator))
    finally:
        procs.stop()
    result["run_id"] = run_id
    if run_id is not None:
        rm.telemetry.flush()
        counts = telemetry_counts(rm.telemetry.query)
        result.update(counts)
        curve = "  ".join(f"{s}:{v:.2f}" for s, v in result["curve"])
        print_summary(run_id, [
            ("task", task.name), ("train steps", str(counts["train_steps"])),
            ("completions (distinct ids)", f"{counts['rollouts']} ({counts['distinct_ids']})"),
            ("held-out mean_reward by step", curve),
            ("gen tokens/s (per generator)", f"{result['gen_tokens_per_s']:.0f}"),
            ("train samples/s", f"{result['train_samples_per_s']:.0f}"),
            ("wall time", f"{result['wall_s']:.1f} s"), ("weight syncs", str(counts["weight_syncs"])),
        ])
    return result


async def _loop(cfg: GRPORecipeConfig, task: AdditionTask, gens, trainer, evaluator) -> dict:
    g, seed = cfg.generator, cfg.run.seed
    per_item = cfg.prompts_per_step // g.replicas
    heldout = task.sample(cfg.eval.episodes, random.Random(10_000 + seed), "heldout")
    work = AsyncWorkScheduler(per_step=g.replicas, max_policy_lag=cfg.buffer.max_policy_lag, prefix="group-")
    stop = asyncio.Event()
    state = {"curve": [], "gen_tokens_per_s": 0.0, "train_s": 0.0, "trained": 0}

    async def generate(gen) -> None:  # one loop per generator replica
        while not stop.is_set():
            item = await work.next_item()
            problems = task.sample(per_item, random.Random(seed * 1_000_003 + item.index), "train")  # same on re-issue
            try:
                r = await gen.generate.call_one(item, problems)
            except rm.ActorDied:
                work.reissue(item)
                await asyncio.sleep(0.5)
                continue
            work.finished(r)
            state["gen_tokens_per_s"] = r["gen_tokens_per_s"]

    async def evaluate(version: int, completions: int) -> None:
        r = await evaluator.evaluate.call_one(heldout, version, completions)
        state["curve"].append((version, r["value"]))
        if cfg.eval.target is not None and r["value"] >= cfg.eval.target:
            stop.set()

    start = time.perf_counter()
    evals = [asyncio.ensure_future(evaluate(0, 0))]  # the starting level (after the warm start)
    loops = [asyncio.ensure_future(generate(gens.slice(procs=i))) for i in range(g.replicas)]
    reward = float("nan")
    with RunProgress(cfg.steps, "steps", cfg.run.progress) as bar:
        step = 0
        while step < cfg.steps and not stop.is_set():
            m = await trainer.train.call_one(g.replicas, cfg.run.train_timeout_s)
            work.rejected(m["dropped"])
            if not m["trained"]:
                continue
            step = m["step"]
            work.consumed(g.replicas, m["policy_version"])
            state["train_s"] += m["duration_s"]
            state["trained"] += int(m["metrics"].get("train/groups", 0)) * g.samples_per_prompt
            reward = m["metrics"].get("rollout/reward_mean", reward)
            if cfg.eval.every and step % cfg.eval.every == 0 or step == cfg.steps:
                evals.append(asyncio.ensure_future(evaluate(m["policy_version"], m["samples_seen"])))
            bar.update(step, step=step, reward=reward, lag=m["max_lag"],
                       sps=m["samples_seen"] / (time.perf_counter() - start))
        await asyncio.gather(*evals)
    stop.set()
    for loop in loops:
        loop.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    state["wall_s"] = time.perf_counter() - start
    state["train_samples_per_s"] = state["trained"] / max(state["train_s"], 1e-9)
    state["curve"].sort()
    return state


if __name__ == "__main__":  # python recipes/grpo.py [overrides]: the grpo_addition recipe unless told otherwise
    import sys

    from rlmesh.recipes_cli import run_main

    args = sys.argv[1:]
    raise SystemExit(run_main(args if any(a.startswith("recipe=") for a in args) else ["recipe=grpo_addition", *args]))
