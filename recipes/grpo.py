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
from rlmesh.actor.faults import FaultInjector
from rlmesh.rl.actors import GRPOTrainer, LLMGenerator, ReplayBuffer, RewardActor
from rlmesh.rl.actors.llm_generator import backend_kwargs_for
from rlmesh.rl.models import TransformerConfig
from rlmesh.rl.placement import place
from rlmesh.rl.recipe_config import GRPORecipeConfig
from rlmesh.rl.report import Phase, RunProgress, print_summary, telemetry_counts
from rlmesh.rl.resilience import (Recovery, RunFailed, WorkLedger, abandon_previous, final_checkpoint,
                                  run_with_replicas, serve_work)
from rlmesh.rl.run_state import begin
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
    run = begin(cfg, launcher)  # a new run, or (run.resume) the same run id, database and checkpoints
    ledger = WorkLedger(run.generation)
    abandoned = abandon_previous(rm.telemetry.query, ledger) if run.generation else 0
    n_procs = cfg.proc_meshes()["rl"]
    procs = place(launcher, cfg.launcher).spawn_procs(per_host={"procs": n_procs}, name="rl",
                                                     restart=rm.Restart(max_restarts=cfg.run.max_restarts))
    try:
        # proc 0: buffer + evaluator, proc 1: trainer, then reward actors, then generators
        buffer = procs.slice(procs=0).spawn("buffer", ReplayBuffer, cfg.buffer)
        rewards = procs.slice(procs=slice(2, 2 + cfg.reward.replicas)).spawn("reward", RewardActor, cfg.reward)
        with Phase(f"trainer warm-up (SFT, {cfg.trainer.sft_steps} steps)" if cfg.trainer.sft_steps else
                   "trainer start", cfg.run.progress):
            trainer = procs.slice(procs=1).spawn("trainer", trainer_cls, cfg.trainer, buffer, model_config, m.path,
                                                 task, g.temperature, task.tokenizer.pad_id, seed=seed)
        backend = backend_kwargs_for(g.backend, task, model_config, m.path, seed)
        evaluator = procs.slice(procs=0).spawn("evaluator", LLMGenerator, g, task, None, rewards, backend)
        gens = procs.slice(procs=slice(2 + cfg.reward.replicas, n_procs)).spawn(
            "generator", LLMGenerator, g, task, buffer, rewards, backend)
        roles = {"generator": gens, "trainer": trainer, "reward": rewards, "buffer": buffer}
        with FaultInjector.from_config(cfg.faults, roles) as faults:
            try:
                result = asyncio.run(_loop(cfg, task, gens, trainer, evaluator, buffer, ledger, run.generation))
            except RunFailed as exc:
                final_checkpoint(trainer, buffer, exc)
                raise
        result["faults_injected"] = len(faults.injected)
    finally:
        procs.stop()
    result.update(run_id=run.run_id, abandoned=abandoned, generation=run.generation)
    if run.run_id is not None:
        rm.telemetry.flush()
        counts = telemetry_counts(rm.telemetry.query)
        result.update(counts)
        curve = "  ".join(f"{s}:{v:.2f}" for s, v in result["curve"])
        print_summary(run.run_id, [
            ("task", task.name), ("train steps", str(counts["train_steps"])),
            ("completions (distinct ids)", f"{counts['rollouts']} ({counts['distinct_ids']})"),
            ("held-out mean_reward by step", curve),
            ("gen tokens/s (per generator)", f"{result['gen_tokens_per_s']:.0f}"),
            ("train samples/s", f"{result['train_samples_per_s']:.0f}"),
            ("wall time", f"{result['wall_s']:.1f} s"), ("weight syncs", str(counts["weight_syncs"])),
            ("work items", f"{counts['work_issued']} issued, {counts['work_reissued']} re-issued, "
                           f"{counts['work_dropped']} dropped, {counts['work_lost']} lost"),
            ("proc failures", f"{counts['proc_deaths']} died, {counts['restarts']} restarted"
                              + (f", median recovery {counts['median_recovery_s']:.2f} s" if counts["restarts"] else "")),
        ])
    return result


async def _loop(cfg: GRPORecipeConfig, task: AdditionTask, gens, trainer, evaluator, buffer, ledger: WorkLedger,
                generation: int) -> dict:
    g, seed = cfg.generator, cfg.run.seed
    per_item = cfg.prompts_per_step // g.replicas
    heldout = task.sample(cfg.eval.episodes, random.Random(10_000 + seed), "heldout")
    prefix = "group-" if generation == 0 else f"group-g{generation}-"  # ids never repeat across resumes
    work = AsyncWorkScheduler(per_step=g.replicas, max_policy_lag=cfg.buffer.max_policy_lag, prefix=prefix,
                              on_event=ledger)
    recovery = Recovery(cfg.run.recovery_timeout_s, meshes={"buffer": buffer, "trainer": trainer})
    stop = asyncio.Event()
    state = {"curve": [], "gen_tokens_per_s": 0.0, "train_s": 0.0, "trained": 0}
    resumed = await trainer.state.call_one()  # a resumed run's trainer starts from its checkpoint

    def replica(i: int):
        one = gens.slice(procs=i)
        call = one.generate.options(timeout=cfg.run.call_timeout_s)

        def run_item(item):  # the same prompts on a re-issue: seeded by the item's index
            problems = task.sample(per_item, random.Random(seed * 1_000_003 + generation * 7_919 + item.index), "train")
            return call.call_one(item, problems)

        return serve_work(work, stop, one, f"generator[{i}]", run_item, recovery,
                          on_result=lambda r: state.update(gen_tokens_per_s=r["gen_tokens_per_s"]))

    async def evaluate(version: int, completions: int) -> None:
        try:
            r = await evaluator.evaluate.call_one(heldout, version, completions)
        except (rm.ActorDied, rm.ActorError) as exc:  # its proc (or a reward proc it used) died: skip this one
            if isinstance(exc, rm.ActorDied):
                await recovery.wait_back(evaluator, exc, "evaluator")
            return
        state["curve"].append((version, r["value"]))
        if cfg.eval.target is not None and r["value"] >= cfg.eval.target:
            stop.set()

    start = time.perf_counter()
    reward = float("nan")

    async def train() -> None:
        nonlocal reward
        evals = [asyncio.ensure_future(evaluate(resumed["policy_version"], resumed["samples_seen"]))]  # starting level
        with RunProgress(cfg.steps, "steps", cfg.run.progress) as bar:
            step = resumed["step"]
            while step < cfg.steps and not stop.is_set():
                m = await recovery.train(trainer, buffer, work, g.replicas, cfg.run.train_timeout_s)
                if m is None:  # not enough fresh rollouts yet, or the trainer or buffer died and is back
                    continue
                step = m["step"]
                state["train_s"] += m["duration_s"]
                state["trained"] += int(m["metrics"].get("train/groups", 0)) * g.samples_per_prompt
                reward = m["metrics"].get("rollout/reward_mean", reward)
                if cfg.eval.every and step % cfg.eval.every == 0 or step == cfg.steps:
                    evals.append(asyncio.ensure_future(evaluate(m["policy_version"], m["samples_seen"])))
                bar.update(step, step=step, reward=reward, lag=m["max_lag"],
                           sps=m["samples_seen"] / (time.perf_counter() - start))
            await asyncio.gather(*evals)

    loops = [asyncio.ensure_future(replica(i)) for i in range(g.replicas)]
    await run_with_replicas(train(), loops, stop, work, ledger)
    state["wall_s"] = time.perf_counter() - start
    state["train_samples_per_s"] = state["trained"] / max(state["train_s"], 1e-9)
    state["curve"].sort()
    return state


if __name__ == "__main__":  # python recipes/grpo.py [overrides]: the grpo_addition recipe unless told otherwise
    import sys

    from rlmesh.recipes_cli import run_main

    args = sys.argv[1:]
    raise SystemExit(run_main(args if any(a.startswith("recipe=") for a in args) else ["recipe=grpo_addition", *args]))
