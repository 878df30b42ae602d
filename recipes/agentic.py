"""GRPO (or any LLM trainer's algorithm) on multi-turn, tool-using episodes: generators play
episodes against environments in their own mesh (``env``), a buffer, an evaluator, a trainer.

    rlmesh run recipe=grpo_calculator                       # multiplication with a calculator tool
    rlmesh run recipe=grpo_calculator env.kwargs.tools=false task.sft_tool_fraction=0   # no tool

Placement: proc 0 holds the buffer and the evaluator, proc 1 the trainer, then the env actors,
then one generator each. The trainer warm-starts on the task's demonstrations (a share of them
using the tool) and publishes version 0. Each work item is ``prompts_per_step / replicas`` tasks,
each played ``samples_per_prompt`` times (a GRPO group); the environment scores each episode.
An env proc that dies fails its generator's item, which the loop re-issues under the same id.
"""

from __future__ import annotations

import random

from rlmesh.recipes.agentic_config import AgenticRecipeConfig
from rlmesh.recipes.loop import Plan, Roles, RunResult, Unit, run_recipe, seeded_prompts
from rlmesh.rl.actors.llm_generator import backend_kwargs_for
from rlmesh.rl.agentic.calculator import MultiplicationTask
from rlmesh.rl.agentic.env_actor import EnvActor
from rlmesh.rl.models import TransformerConfig
from rlmesh.rl.run.placement import actor_class


def make_task(cfg: AgenticRecipeConfig) -> MultiplicationTask:
    t = cfg.task
    return MultiplicationTask(t.min_digits, t.max_digits, t.heldout_fraction, t.sft_tool_fraction)


def main(cfg: AgenticRecipeConfig, launcher: str = "local") -> RunResult:
    g, m, seed = cfg.generator, cfg.model, cfg.run.seed
    generator_cls, trainer_cls = actor_class(g, "generator"), actor_class(cfg.trainer, "trainer")
    buffer_cls = actor_class(cfg.buffer, "buffer")
    task = make_task(cfg)
    model_config = None if m.path else TransformerConfig(
        vocab_size=task.tokenizer.vocab_size, max_seq_len=task.max_prompt_len() + g.max_episode_tokens,
        d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads)
    backend = backend_kwargs_for(g.backend, task, model_config, m.path, seed)
    n_procs = cfg.proc_meshes()["rl"]
    first_gen = 2 + cfg.env.replicas

    def spawn(procs) -> Roles:
        buffer = procs.slice(procs=0).spawn("buffer", buffer_cls, cfg.buffer)
        env = procs.slice(procs=slice(2, first_gen)).spawn("env", EnvActor, cfg.env.cls, dict(cfg.env.kwargs),
                                                          cfg.env.max_workers)
        trainer = procs.slice(procs=1).spawn("trainer", trainer_cls, cfg.trainer, buffer, model_config, m.path, task,
                                             g.temperature, task.tokenizer.pad_id, seed=seed)
        evaluator = procs.slice(procs=0).spawn("evaluator", generator_cls, g, task, None, env, backend)
        generators = procs.slice(procs=slice(first_gen, n_procs)).spawn(
            "generator", generator_cls, g, task, buffer, env, backend)
        return Roles(generators, trainer, buffer, evaluator, others={"env": env})

    prompts = seeded_prompts(task, cfg.prompts_per_step // g.replicas, seed)  # the same ones on a re-issue
    heldout = task.sample(cfg.eval.episodes, random.Random(10_000 + seed), "heldout")
    numbers = {"gen_tokens_per_s": 0.0, "turns": 0, "episodes": 0}

    def on_work(r: dict) -> None:
        numbers.update(gen_tokens_per_s=r["gen_tokens_per_s"])
        numbers["turns"] += r["turns"]
        numbers["episodes"] += r["samples"]

    def summary(result: RunResult) -> list[tuple[str, str]]:
        curve = "  ".join(f"{e.policy_version}:{e.value:.2f}" for _, e in result.evals)
        return [("task", task.name + ("" if cfg.env.kwargs.get("tools", True) else " (no tools)")),
                ("held-out accuracy by version", curve),
                ("turns per episode", f"{numbers['turns'] / max(numbers['episodes'], 1):.2f}"),
                ("gen tokens/s (per generator)", f"{numbers['gen_tokens_per_s']:.0f}")]

    plan = Plan(budget=cfg.steps, unit=Unit.TRAIN_STEPS, work_endpoint="generate", work_args=prompts,
                eval_args=lambda version, samples: (heldout, version, samples), id_prefix="episodes",
                eval_at_start=True, reward_metric="rollout/reward_mean", on_work=on_work,
                on_train=lambda r: None, extras=lambda: dict(numbers), summary=summary)
    return run_recipe(cfg, launcher, spawn, plan)


if __name__ == "__main__":
    import sys

    from rlmesh.recipes.cli import run_main

    args = sys.argv[1:]
    raise SystemExit(run_main(args if any(a.startswith("recipe=") for a in args) else ["recipe=grpo_calculator", *args]))
