"""GRPO (or any LLM trainer's algorithm) on a verifiable task: synthetic addition for the built-in
transformer, or a prompt data set for a Hugging Face model folder; generators, reward actors, a
buffer, an evaluator and a trainer in their own procs.

    rlmesh run recipe=grpo_addition                              # ~6 min on 2 CPU cores
    rlmesh run recipe=grpo_addition steps=50 eval.every=10 trainer.sft_steps=50
    rlmesh run recipe=grpo_gsm8k model.path=/models/SmolLM2-135M-Instruct   # a real model, a data file
    rlmesh run recipe=grpo_gsm8k model.path=... generator=vllm

Placement: proc 0 holds the buffer and the evaluator, procs 1 to ``trainer.ranks`` the trainer
(docs/trainer.md), then the reward actors, then one generator each. The trainer warm-starts (SFT on the task format, standing in
for a pretrained LM) and publishes version 0. The loop (:mod:`rlmesh.recipes.loop`): the
recipe deals seeded prompts into work items; each generator samples ``samples_per_prompt``
completions per prompt, has a reward actor verify them and hands the scored groups to the
buffer; the trainer takes a batch of fresh groups and runs its algorithm's step
(``rlmesh/rl/algorithms/grpo.py`` for GRPO); the evaluator scores greedy answers on
held-out prompts (never trained on) at the start and every ``eval.every`` steps.
"""

from __future__ import annotations

import random

from rlmesh.recipes.loop import Plan, Roles, RunResult, Unit, run_recipe, seeded_prompts
from rlmesh.recipes.recipe_config import GRPORecipeConfig
from rlmesh.rl.actors.llm_generator import backend_kwargs_for
from rlmesh.rl.models import TransformerConfig
from rlmesh.rl.models.hf import HFTokenizer
from rlmesh.rl.names import has_tokenizer
from rlmesh.rl.run.placement import actor_class, call_trainer, trainer_procs
from rlmesh.rl.results import TrainResult
from rlmesh.rl.tasks import AdditionTask, DatasetTask, TextTask
from rlmesh.telemetry.api import current_run_dir


def make_task(cfg: GRPORecipeConfig) -> TextTask:
    """The task (seeded, with a held-out split disjoint from training), speaking the model's tokenizer
    when the model folder has one: the task renders and checks text, the model's tokenizer makes ids."""
    t = cfg.task
    if t.kind == "dataset":
        task: TextTask = DatasetTask(t.path, t.prompt_field, t.answer_field, t.system_field, t.system_prompt,
                                     t.template, t.answer_pattern, t.heldout_path, t.heldout_fraction, t.shuffle, t.name)
    else:
        task = AdditionTask(t.min_digits, t.max_digits, t.heldout_fraction, reverse_answer=t.reverse_answer)
        task.name = t.name or task.name
    if cfg.model.path and has_tokenizer(cfg.model.path):
        task.use_tokenizer(HFTokenizer(cfg.model.path))
    return task


def main(cfg: GRPORecipeConfig, launcher: str = "local") -> RunResult:
    g, m, seed = cfg.generator, cfg.model, cfg.run.seed
    # each role's class comes from its config (`_target_`): trainer=grpo, a plugin's trainer=..., reward=...
    generator_cls, trainer_cls = actor_class(g, "generator"), actor_class(cfg.trainer, "trainer")
    buffer_cls, reward_cls = actor_class(cfg.buffer, "buffer"), actor_class(cfg.reward, "reward")
    evaluator_cls = actor_class(cfg.eval, "eval") if cfg.eval._target_ else generator_cls
    task = make_task(cfg)
    model_config = None if m.path else TransformerConfig(
        vocab_size=task.tokenizer.vocab_size, max_seq_len=task.max_prompt_len + g.max_new_tokens,
        d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads)
    backend = backend_kwargs_for(g.backend, task, model_config, m.path, seed, g, m.lora)
    n_procs = cfg.proc_meshes()["rl"]

    def spawn(procs) -> Roles:
        after = 1 + cfg.trainer.ranks  # procs 1 .. trainer.ranks hold the trainer
        buffer = procs.slice(procs=0).spawn("buffer", buffer_cls, cfg.buffer)
        rewards = procs.slice(procs=slice(after, after + cfg.reward.replicas)).spawn("reward", reward_cls, cfg.reward)
        trainer = trainer_procs(procs, 1, cfg.trainer.ranks).spawn("trainer", trainer_cls, cfg.trainer, buffer, model_config, m.path, task,
                                             g.temperature, None, seed=seed, dtype=m.dtype,
                                             gradient_checkpointing=m.gradient_checkpointing, lora=m.lora)
        evaluator = procs.slice(procs=0).spawn("evaluator", evaluator_cls, g, task, None, rewards, backend)
        generators = procs.slice(procs=slice(after + cfg.reward.replicas, n_procs)).spawn(
            "generator", generator_cls, g, task, buffer, rewards, backend)
        return Roles(generators, trainer, buffer, evaluator, others={"reward": rewards})

    prompts = seeded_prompts(task, cfg.prompts_per_step // g.replicas, seed)  # the same ones on a re-issue
    heldout = task.sample(cfg.eval.episodes, random.Random(10_000 + seed), "heldout")
    numbers: dict = {"gen_tokens_per_s": 0.0, "train_s": 0.0, "trained": 0, "model_dir": None}

    def on_train(r: TrainResult) -> None:
        numbers["train_s"] += r.duration_s
        numbers["trained"] += int(r.metric("train/groups", 0)) * g.samples_per_prompt

    def extras() -> dict:
        return {"gen_tokens_per_s": numbers["gen_tokens_per_s"], "model_dir": numbers["model_dir"],
                "train_samples_per_s": numbers["trained"] / max(numbers["train_s"], 1e-9)}

    def summary(result: RunResult) -> list[tuple[str, str]]:
        curve = "  ".join(f"{e.policy_version}:{e.value:.2f}" for _, e in result.evals)
        return [("task", task.name), ("held-out mean_reward by version", curve),
                ("gen tokens/s (per generator)", f"{result.extras['gen_tokens_per_s']:.3g}"),
                *([("trained model (transformers folder)", result.extras["model_dir"])] if result.extras["model_dir"] else []),
                ("train samples/s", f"{result.extras['train_samples_per_s']:.3g}")]

    def finish(roles: Roles, result: RunResult) -> None:
        """A model folder's run ends with the trained model as a folder transformers loads."""
        run_dir = current_run_dir()
        if m.path and m.export and run_dir is not None:
            numbers["model_dir"] = call_trainer(roles.trainer, "export", str(run_dir / "model")).get()

    plan = Plan(budget=cfg.steps, unit=Unit.TRAIN_STEPS, work_endpoint="generate", work_args=prompts,
                eval_args=lambda version, samples: (heldout, version, samples), id_prefix="group",
                eval_at_start=True, reward_metric="rollout/reward_mean",
                on_work=lambda r: numbers.update(gen_tokens_per_s=r["gen_tokens_per_s"]), on_train=on_train,
                extras=extras, summary=summary, finish=finish)
    return run_recipe(cfg, launcher, spawn, plan)


if __name__ == "__main__":  # python recipes/grpo.py [overrides]: the grpo_addition recipe unless told otherwise
    import sys

    from rlmesh.recipes.cli import run_main

    args = sys.argv[1:]
    raise SystemExit(run_main(args if any(a.startswith("recipe=") for a in args) else ["recipe=grpo_addition", *args]))
