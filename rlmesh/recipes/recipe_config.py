"""Complete experiment configs: one dataclass per recipe, composed of the component
configs of :mod:`rlmesh.rl.config`. The tuned presets the benchmarks measure live in YAML
only (``configs/recipe/*.yaml``; ``compose(["recipe=ppo_cartpole"])`` builds one).

These are the Hydra schemas (registered by :mod:`rlmesh.recipes.config_store`): YAML under
``rlmesh/configs/`` only selects and overrides them. Cross-field checks ("impossible
combinations") live here, in the recipe's ``__post_init__``, because only the recipe
sees all the groups at once; they run on the final, overridden values when
``OmegaConf.to_object`` builds the dataclasses, before any proc starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from rlmesh import settings
from rlmesh.actor.faults import FaultConfig
from rlmesh.actor.supervision import FailureDetection, Restart
from rlmesh.rl.config import (
    DTYPES,
    BufferConfig,
    LoRAConfig,
    GRPOConfig,
    GymGeneratorConfig,
    GymTrainerConfig,
    LLMGeneratorConfig,
    PPOConfig,
    RewardConfig,
    check,
)
from rlmesh.recipes.workspace_option import WorkspaceConfig
from rlmesh.rl.names import check_model_path, has_tokenizer
from rlmesh.rl.tasks.dataset import resolve_data_path
from rlmesh.rl.tasks.tokenizer import CharTokenizer
from rlmesh.telemetry.config import TelemetryConfig


@dataclass
class RunConfig:
    """Settings of the controller program itself, the same for every recipe."""

    seed: int = 0
    """Seeds the trainer; generator replicas derive their env seeds from ``generator.seed``."""
    progress: bool = True
    """Show the live progress bar (rich) on a terminal."""
    max_restarts: int = 10
    """Restart budget of every proc (``rm.Restart``): at most this many restarts within any
    ``restart_window_s`` seconds; 0 never, -1 forever. A restarted trainer resumes from its newest
    checkpoint; a generator's lost work is re-issued. A proc that exceeds it (a crash loop) stops
    the run, after a final checkpoint, with a message naming it. Why 10 in 30 s: docs/faults.md."""
    restart_window_s: Optional[float] = 30.0
    """The window of ``max_restarts`` (null: a lifetime count, the old meaning)."""
    start_timeout_s: float = settings.START_TIMEOUT_S.default
    """A proc must join (interpreter started, imports done) within this; a busy host needs more.
    The same default as ``RLMESH_START_TIMEOUT_S`` (120 s), which a recipe does not read."""
    spawn_timeout_s: Optional[float] = None
    """Bound on one actor's ``__init__`` while its proc lives (null: none; a long construction,
    like GRPO's SFT warm start, is not a hang, and a dead or frozen proc is caught anyway)."""
    heartbeat_timeout_s: float = 1.5
    """Least heartbeat silence that makes a proc dead; on a busy host the allowance grows with the
    heartbeat delays observed (a stopped or exited local proc is seen by the OS, at once)."""
    init_heartbeat_timeout_s: float = 60.0
    """The same floor while an actor's ``__init__`` runs (imports and model loads hold the GIL)."""
    train_timeout_s: float = 120.0
    """How long one train call waits for enough fresh rollouts before the controller checks again."""
    call_timeout_s: Optional[float] = None
    """Give up on one generator call after this long and re-issue its work (null: no limit; a
    hung proc is still caught by its heartbeat)."""
    recovery_timeout_s: float = 120.0
    """How long the controller waits for a failed proc's replacement before the run fails."""
    resume: Optional[str] = None
    """A run id to continue (``rlmesh run resume=RUN|latest`` sets it): same run id, same
    telemetry database, the trainer's newest checkpoint."""

    def __post_init__(self) -> None:
        check(self.max_restarts >= -1, "run.max_restarts", self.max_restarts, "use -1 (forever), 0 (never) or more")
        check(self.train_timeout_s > 0, "run.train_timeout_s", self.train_timeout_s, "use a positive number of seconds")
        check(self.call_timeout_s is None or self.call_timeout_s > 0, "run.call_timeout_s", self.call_timeout_s,
              "use a positive number of seconds, or null for no limit")
        check(self.recovery_timeout_s > 0, "run.recovery_timeout_s", self.recovery_timeout_s,
              "use a positive number of seconds")
        for key in ("start_timeout_s", "heartbeat_timeout_s", "init_heartbeat_timeout_s"):
            check(getattr(self, key) > 0, f"run.{key}", getattr(self, key), "use a positive number of seconds")
        for key in ("restart_window_s", "spawn_timeout_s"):
            check(getattr(self, key) is None or getattr(self, key) > 0, f"run.{key}", getattr(self, key),
                  "use a positive number of seconds, or null")

    def restart_policy(self) -> Restart:
        """``spawn_procs(restart=...)`` for every mesh of a recipe: the budget and the timeouts above."""
        detect = FailureDetection(start_timeout_s=self.start_timeout_s, heartbeat_timeout_s=self.heartbeat_timeout_s,
                                  init_heartbeat_timeout_s=max(self.init_heartbeat_timeout_s, self.heartbeat_timeout_s),
                                  spawn_timeout_s=self.spawn_timeout_s, key_prefix="run.")
        return Restart(max_restarts=self.max_restarts, within_s=self.restart_window_s, detection=detect)


def check_faults(faults: FaultConfig, run: RunConfig, roles: tuple[str, ...]) -> None:
    """Fault injection aims at a role the recipe has, and the procs it hits may be restarted."""
    faults.check_roles(roles)
    check(faults.target is None or run.max_restarts != 0, "run.max_restarts", run.max_restarts,
          f"faults.{faults.kind}={faults.target} kills procs: allow restarts (run.max_restarts=10, or -1 for forever)")


@dataclass
class EvalConfig:
    """When and how the policy is evaluated (rows in the ``evals`` table)."""

    every: int = 2048
    """Evaluate after every this many trained env steps (gym) or train steps (LLM); 0 = only at the end."""
    episodes: int = 20
    """Greedy episodes on fresh envs (gym), or held-out prompts (LLM)."""
    target: Optional[float] = None
    """Stop early once an evaluation reaches this (``mean_return`` / ``mean_reward``); null = never."""
    _target_: Optional[str] = None
    """The evaluator actor class; null = the generator's class (``generator._target_``)."""

    def __post_init__(self) -> None:
        check(self.every >= 0, "eval.every", self.every, "use 0 (only at the end) or a positive interval")
        check(self.episodes >= 1, "eval.episodes", self.episodes, "use 1 or more")


@dataclass
class PPORecipeConfig:
    """A complete PPO experiment: generator, trainer, buffer, evaluation, run, launcher, telemetry."""

    program: str = "ppo"
    """Controller program under ``recipes/`` that runs this config."""
    generator: GymGeneratorConfig = field(default_factory=GymGeneratorConfig)
    trainer: GymTrainerConfig = field(default_factory=PPOConfig)
    """Any gym trainer config (``trainer=ppo``, or a plugin's): its ``_target_`` is the trainer class."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    launcher: Dict[str, Any] = field(default_factory=dict)
    """The ``launcher`` group (``local``: nothing to set; ``kubernetes``: ``KubernetesConfig`` fields;
    ``slurm``: ``SlurmConfig`` fields)."""
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    """Built-in fault injection (``faults=generator_kill``, ``faults.kill=trainer``); off by default."""
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """The controller's project folder to every proc (``workspace.sync=true``; on for Kubernetes by default)."""

    def proc_meshes(self) -> dict[str, int]:
        """Proc meshes the recipe spawns, by name: buffer+evaluator, trainer, one per generator
        (``rlmesh k8s render`` sizes pods from this; ``launcher.meshes.rl.*`` sets their resources); with
        ``generator.in_trainer`` the trainer's proc collects and there are no generator procs."""
        return {"rl": 2 if self.generator.in_trainer else self.generator.replicas + 2}

    def __post_init__(self) -> None:
        check(self.program == "ppo", "program", self.program, "a PPO config runs with program=ppo")
        if self.generator.in_trainer is None:  # on where collecting and training take turns anyway
            self.generator.in_trainer = (isinstance(self.trainer, PPOConfig) and self.trainer.ranks == 1
                                         and self.generator.replicas == 1 and self.buffer.max_policy_lag == 0
                                         and self.faults.target != "generator")
        if self.generator.in_trainer:
            check(isinstance(self.trainer, PPOConfig), "generator.in_trainer", True,
                  f"only PPO-family trainers (ppo, a2c) collect in their own proc, not {type(self.trainer).__name__}'s; "
                  "use generator.in_trainer=false")
            check(self.generator.replicas == 1, "generator.replicas", self.generator.replicas,
                  "generator.in_trainer=true collects in the one trainer proc: leave generator.replicas at 1")
            check(self.trainer.ranks == 1, "trainer.ranks", self.trainer.ranks,
                  "generator.in_trainer=true collects in a one-rank trainer: use trainer.ranks=1")
        check_faults(self.faults, self.run, ("trainer", "buffer") if self.generator.in_trainer
                     else ("generator", "trainer", "buffer"))
        per_rollout = self.generator.num_envs * self.generator.num_steps
        batch = per_rollout * self.generator.replicas
        self.trainer.check_batch(batch)
        check(self.buffer.capacity >= self.generator.replicas * (self.buffer.max_policy_lag + 1),
              "buffer.capacity", self.buffer.capacity,
              f"hold at least generator.replicas * (buffer.max_policy_lag + 1) = "
              f"{self.generator.replicas * (self.buffer.max_policy_lag + 1)} rollouts, or rollouts are evicted unused")
        check(self.trainer.total_steps >= batch, "trainer.total_steps", self.trainer.total_steps,
              f"the budget must cover at least one train batch ({batch} env steps)")


TASK_KINDS = ("addition", "dataset")
"""The tasks of the GRPO recipes: the synthetic addition task, or prompts from a data file."""


@dataclass
class TaskConfig:
    """Where an LLM recipe's prompts come from: ``kind=addition`` (:class:`rlmesh.rl.tasks.AdditionTask`,
    generated) or ``kind=dataset`` (:class:`rlmesh.rl.tasks.DatasetTask`: a local JSONL, Parquet or CSV
    file, read with DuckDB). The ``task`` config group has presets (``task=gsm8k``)."""

    kind: str = "addition"
    """``addition`` or ``dataset``."""
    min_digits: int = 1
    """Smallest operand size (addition)."""
    max_digits: int = 2
    """Largest operand size (addition)."""
    reverse_answer: bool = True
    """Answers least-significant digit first (addition; far easier for small transformers)."""
    heldout_fraction: float = 0.1
    """Share of problems reserved for evaluation, never trained on (by a stable hash of each prompt)."""
    path: Optional[str] = None
    """The data file (dataset): ``.jsonl``, ``.parquet`` or ``.csv``; relative paths are from the
    working directory, and a path starting with ``pkg:`` names a file rlmesh ships (``pkg:gsm8k_sample.jsonl``)."""
    prompt_field: str = "prompt"
    """The column holding the prompt (dataset; GSM8K's is ``question``)."""
    answer_field: str = "answer"
    """The column holding the reference answer (dataset)."""
    answer_pattern: Optional[str] = None
    """A regular expression whose first group is the answer inside the answer column (GSM8K:
    ``####\\s*(.+)$``); null = the whole column."""
    system_field: Optional[str] = None
    """A column with each row's system prompt (dataset); null = ``system_prompt``."""
    system_prompt: Optional[str] = None
    """One system prompt for every row (model folders with a chat template)."""
    template: str = "{prompt}"
    """How a row's prompt is written out for the model; ``{prompt}`` is the row's prompt."""
    heldout_path: Optional[str] = None
    """Held-out rows from their own file (dataset); null = ``heldout_fraction`` of ``path``."""
    shuffle: bool = True
    """Walk the training rows in a seeded order per epoch (dataset); false = file order."""
    name: Optional[str] = None
    """The ``rollouts.env`` name; null = the file's stem (dataset) or ``addition_<min>-<max>``."""

    def __post_init__(self) -> None:
        check(self.kind in TASK_KINDS, "task.kind", self.kind, f"use one of {', '.join(TASK_KINDS)}")
        check(1 <= self.min_digits <= self.max_digits, "task.min_digits", self.min_digits,
              f"use 1 <= task.min_digits <= task.max_digits ({self.max_digits})")
        check(0 < self.heldout_fraction < 1, "task.heldout_fraction", self.heldout_fraction, "use a value in (0, 1)")
        check(self.kind != "dataset" or bool(self.path), "task.path", self.path,
              "task.kind=dataset reads prompts from a file: set task.path=/path/to/train.jsonl (or .parquet, .csv)")
        check("{prompt}" in self.template, "task.template", self.template,
              "the template must contain {prompt}, where each row's prompt goes")


AdditionTaskConfig = TaskConfig
"""The former name of :class:`TaskConfig` (the addition task's fields are its defaults)."""


@dataclass
class PolicyModelConfig:
    """The policy network of LLM recipes: the built-in transformer, or a local HF folder."""

    path: Optional[str] = None
    """A local Hugging Face folder (``save_pretrained``); null = build the small transformer below.
    Its tokenizer and chat template come with it: prompts are rendered and completions decoded by it."""
    d_model: int = 128
    """Residual width of the built-in transformer."""
    n_layers: int = 2
    """Blocks."""
    n_heads: int = 4
    """Attention heads (must divide d_model)."""
    dtype: str = "float32"
    """The trainer's parameter dtype (model folders): ``float32`` or ``bfloat16``."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (model folders): less
    memory for longer sequences, about a third more compute."""
    export: bool = True
    """At the end of a run, write the trained model as a Hugging Face folder (``runs/<run>/model``) that
    ``AutoModelForCausalLM.from_pretrained`` loads (model folders only; LoRA adapters merged in)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (model folders): ``model.lora.r=16`` trains adapters only (docs/llm.md)."""

    def __post_init__(self) -> None:
        check(self.d_model >= 1 and self.n_heads >= 1 and self.d_model % self.n_heads == 0, "model.n_heads",
              self.n_heads, f"pick a head count that divides model.d_model ({self.d_model})")
        check(self.n_layers >= 1, "model.n_layers", self.n_layers, "use 1 or more")
        check(self.dtype in DTYPES, "model.dtype", self.dtype, f"use one of {', '.join(DTYPES)}")
        check(self.lora.r == 0 or self.path is not None, "model.lora.r", self.lora.r,
              "LoRA adapts a Hugging Face model folder: set model.path, or model.lora.r=0 for the built-in model")


def check_task_and_model(task: TaskConfig, model: PolicyModelConfig, remote: bool) -> None:
    """Refuse, before any proc starts, a task and a model whose tokenizers cannot agree: a text data set
    needs the model folder's tokenizer; a folder without one can only read the addition task's
    characters, and only if its vocabulary covers them. ``remote``: the folder lives on the pods."""
    if task.kind == "dataset":
        check(model.path is not None, "model.path", model.path,
              "task.kind=dataset has text prompts, which the built-in character model cannot read: set "
              "model.path to a Hugging Face model folder with a tokenizer (bash scripts/setup_model.sh builds "
              "SmolLM2-135M-Instruct and prints its folder)")
        if not remote:
            for key in ("path", "heldout_path"):
                value = getattr(task, key)
                if value is not None:
                    check(resolve_data_path(value).is_file(), f"task.{key}", value,
                          "no such file: give a local .jsonl, .parquet or .csv file (or pkg:<name> for a shipped one)")
    if model.path is None or remote:
        return
    folder = Path(model.path).expanduser()
    if not (folder / "config.json").is_file():
        return  # check_model_path names this
    if not has_tokenizer(folder):
        check(task.kind == "addition", "model.path", model.path,
              "the folder has no tokenizer, so it cannot read text prompts: use a folder with one "
              "(save_pretrained of the tokenizer too)")
        vocab = json.loads((folder / "config.json").read_text()).get("vocab_size", 0)
        need = CharTokenizer("0123456789+=").vocab_size
        check(vocab >= need, "model.path", model.path,
              f"the folder has no tokenizer and a vocabulary of {vocab} ids, fewer than the addition task's "
              f"{need} characters: use a model folder with a tokenizer")


@dataclass
class GRPORecipeConfig:
    """A complete GRPO experiment: task, model, LLM generator, reward, trainer, buffer, evaluation."""

    program: str = "grpo"
    """Controller program under ``recipes/`` that runs this config."""
    task: TaskConfig = field(default_factory=TaskConfig)
    model: PolicyModelConfig = field(default_factory=PolicyModelConfig)
    generator: LLMGeneratorConfig = field(default_factory=LLMGeneratorConfig)
    reward: RewardConfig = field(default_factory=lambda: RewardConfig(kind="exact_match"))
    trainer: GRPOConfig = field(default_factory=GRPOConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=100, episodes=500))
    run: RunConfig = field(default_factory=RunConfig)
    steps: int = 1000
    """GRPO train steps."""
    prompts_per_step: int = 128
    """Prompts generated per train step, split evenly over ``generator.replicas`` work items."""
    launcher: Dict[str, Any] = field(default_factory=dict)
    """The ``launcher`` group (``local``: nothing to set; ``kubernetes``: ``KubernetesConfig`` fields;
    ``slurm``: ``SlurmConfig`` fields)."""
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    """Built-in fault injection (``faults=generator_kill``, ``faults.kill=reward``); off by default."""
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """The controller's project folder to every proc (``workspace.sync=true``; on for Kubernetes by default)."""

    def proc_meshes(self) -> dict[str, int]:
        """Proc meshes the recipe spawns, by name: buffer+evaluator, trainer (``trainer.ranks`` procs), reward
        actors, generators."""
        return {"rl": 1 + self.trainer.ranks + self.reward.replicas + self.generator.replicas}

    def __post_init__(self) -> None:
        check(self.program == "grpo", "program", self.program, "a GRPO config runs with program=grpo")
        check_faults(self.faults, self.run, ("generator", "trainer", "reward", "buffer"))
        check(self.reward.kind != "env", "reward.kind", self.reward.kind,
               "GRPO on text needs a verifier: use 'exact_match' or 'numeric' (or 'model' with a subclass)")
        check_llm_recipe(self, "samples per prompt")
        if self.task.kind == "addition" and self.model.path is None:
            check(self.generator.max_new_tokens >= self.task.max_digits + 2, "generator.max_new_tokens",
                  self.generator.max_new_tokens,
                  f"answers need up to task.max_digits + 2 = {self.task.max_digits + 2} tokens (digits, carry, EOS)")
        check_task_and_model(self.task, self.model, bool(self.launcher))
        if self.trainer.lr_decay_steps is None and self.trainer.lr_schedule != "constant":
            self.trainer.lr_decay_steps = self.steps


def check_llm_recipe(cfg: Any, group: str) -> None:
    """The checks every LLM recipe schema shares (GRPO, agentic): group size, budget, DAPO's
    refills against the lag bound, prompts per work item, and where the model comes from.
    ``group`` names what a group is made of in the error ("samples per prompt", "episodes per task")."""
    check(cfg.generator.samples_per_prompt >= 2, "generator.samples_per_prompt",
          cfg.generator.samples_per_prompt, f"GRPO's group baseline needs at least 2 {group}")
    check(cfg.steps >= 1, "steps", cfg.steps, "use 1 or more train steps")
    refills = getattr(cfg.trainer, "max_refills", 0)  # DAPO's dynamic sampling pulls this many extra batches
    check(refills <= cfg.buffer.max_policy_lag, "trainer.max_refills", refills,
          f"generation runs only buffer.max_policy_lag={cfg.buffer.max_policy_lag} batches ahead, so a refill "
          f"beyond that waits for rollouts no generator may produce: use trainer.max_refills<="
          f"{cfg.buffer.max_policy_lag} or raise buffer.max_policy_lag")
    check(cfg.prompts_per_step >= cfg.generator.replicas and cfg.prompts_per_step % cfg.generator.replicas == 0,
          "prompts_per_step", cfg.prompts_per_step,
          f"use a multiple of generator.replicas ({cfg.generator.replicas}) so each work item gets the same prompts")
    check(not (cfg.generator.backend == "vllm" and cfg.model.path is None), "model.path", cfg.model.path,
          "generator.backend=vllm loads a local Hugging Face folder: set model.path=/path/to/model")
    check(cfg.trainer.sft_steps == 0 or cfg.model.path is None, "trainer.sft_steps", cfg.trainer.sft_steps,
          "the SFT warm start is for the built-in transformer; use trainer.sft_steps=0 with model.path")
    if not cfg.launcher:  # local procs read it from this host; a pod may hold it in its image instead
        check_model_path(cfg.model.path, "model.path")
