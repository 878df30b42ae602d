"""Structured configs for the RL layer: plain dataclasses, one docstring per field.

They import nothing from the runtime, so Hydra can register them in a ConfigStore and a
bad value fails in ``__post_init__`` (with the key and the fix in the message) before
any process starts: ``OmegaConf.to_object(cfg)`` builds the dataclasses, which runs the
checks on the final, overridden values. Choices are typed ``str`` and checked by hand
because OmegaConf rejects ``typing.Literal`` annotations.

Each role's config names the actor class it configures in ``_target_`` (a dotted path, as
Hydra spells it): the recipe spawns that class with the config as its first argument
(:func:`rlmesh.rl.run.placement.actor_class`), so choosing a config (``trainer=grpo``) chooses the
class, and a subclass brings its own config dataclass with its own ``_target_``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from rlmesh.errors import ConfigError  # re-exported: one ConfigError for the whole project (rm.ConfigError)
from rlmesh.rl.names import check_env_id


__all__ = [
    "BufferConfig",
    "ConfigError",
    "GRPOConfig",
    "GymTrainerConfig",
    "GymGeneratorConfig",
    "LLMGeneratorConfig",
    "LoRAConfig",
    "PPOConfig",
    "ReplayConfig",
    "RewardConfig",
    "TrainerConfig",
]


DTYPES = ("float32", "bfloat16")
"""The model dtypes the LLM recipes take (names as torch spells them)."""


@dataclass
class LoRAConfig:
    """LoRA adapters (through ``peft``) on a model folder: only the adapters train, and only they
    travel to the generators. ``r=0`` (the default) trains every weight."""

    r: int = 0
    """Adapter rank; 0 = no LoRA (full fine-tuning)."""
    alpha: float = 16.0
    """Scale of the adapters' update (``alpha / r`` multiplies it)."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training."""
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Linear layers that get adapters (names inside the model, as peft matches them)."""

    def __post_init__(self) -> None:
        check(self.r >= 0, "model.lora.r", self.r, "use 0 (no LoRA) or a rank such as 8 or 16")
        check(self.alpha > 0, "model.lora.alpha", self.alpha, "use a positive scale, e.g. 16")
        check(0 <= self.dropout < 1, "model.lora.dropout", self.dropout, "use a value in [0, 1)")
        check(bool(self.target_modules), "model.lora.target_modules", self.target_modules,
              "name at least one linear layer, e.g. [q_proj,v_proj]")


def check(ok: bool, key: str, value: object, fix: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, its ``value`` and the ``fix`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: {fix}")


@dataclass
class GymGeneratorConfig:
    """What a ``GymGenerator`` steps and how much it collects per rollout."""

    _target_: str = "rlmesh.rl.actors.GymGenerator"
    """The generator actor class (spawned as ``cls(config, buffer)``; the evaluator as ``cls(config)``)."""
    env_id: str = "CartPole-v1"
    """Any registered gymnasium id; vectorised natively where gymnasium can (``make_vec``)."""
    num_envs: int = 8
    """Environments stepped in lockstep by one generator."""
    num_steps: int = 32
    """Steps per env per rollout; a rollout holds ``num_envs * num_steps`` transitions."""
    replicas: int = 1
    """Generator actors; each has its own envs and seed offset."""
    seed: int = 0
    """Base seed; replica ``i`` seeds its envs with ``seed + 1000 * i``."""
    vectorization: str = "auto"
    """``auto``: the env's native vectorised implementation when gymnasium has one (CartPole
    does), else ``sync`` (one process, envs stepped in a loop); ``async``: a subprocess per env."""
    in_trainer: Optional[bool] = None
    """Step the envs in the trainer's proc, with the very module it trains: no generator procs, no
    weight version per update (one per ``collect_and_train`` call, for the evaluator). Strictly on-policy
    collection and training take turns anyway, so this saves each update a round trip through the
    procs and a weight version (A2C on 40 transitions an update: 1.7x faster). ``null`` (the default):
    on exactly when it cannot slow a run down: a PPO-family trainer on one rank, one replica, strictly
    on-policy (``buffer.max_policy_lag=0``), no fault injected into generators. ``true``: on (PPO-family,
    one replica, one rank; strictly on-policy whatever the buffer says); ``false``: generator procs."""

    def __post_init__(self) -> None:
        check(self.vectorization in ("auto", "sync", "async"), "generator.vectorization", self.vectorization,
               "use 'auto', 'sync' or 'async'")
        check(self.num_envs >= 1, "generator.num_envs", self.num_envs, "set generator.num_envs to 1 or more")
        check(self.num_steps >= 1, "generator.num_steps", self.num_steps, "set generator.num_steps to 1 or more")
        check(self.replicas >= 1, "generator.replicas", self.replicas, "set generator.replicas to 1 or more")
        check_env_id(self.env_id, "generator.env_id")


@dataclass
class LLMGeneratorConfig:
    """How an ``LLMGenerator`` samples completions."""

    _target_: str = "rlmesh.rl.actors.LLMGenerator"
    """The generator actor class (spawned as ``cls(config, task, buffer, rewards, backend_kwargs)``)."""
    backend: str = "torch"
    """``torch``: the built-in small transformer with KV cache (CPU); ``vllm``: vLLM's engine."""
    samples_per_prompt: int = 8
    """N completions per prompt (GRPO's group size)."""
    max_new_tokens: int = 16
    """Completion length cap."""
    temperature: float = 1.0
    """Sampling temperature; keep 1.0 for on-policy log-probs that match training."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1.0 disables it."""
    replicas: int = 1
    """Generator actors."""
    stop: List[str] = field(default_factory=list)
    """Strings that end a completion besides the model's EOS (left out of the text; the tokens after
    them are neither scored nor trained). Both backends cut at the same place."""
    max_prompt_tokens: Optional[int] = None
    """Longer prompts keep their last this many tokens (``rollouts.prompt_truncated`` counts them);
    ``None``: no limit (the vLLM backend's context is sized from it and ``max_new_tokens``)."""
    samples_per_item: int = 2
    """Completions of each work item written to the ``samples`` table (prompt, completion, reward)."""
    sample_chars: int = 2000
    """Prompt and completion text kept per ``samples`` row (the table stays bounded)."""
    dtype: str = "float32"
    """The generation model's dtype: ``float32`` or ``bfloat16`` (model folders only)."""

    def __post_init__(self) -> None:
        check(self.backend in ("torch", "vllm"), "generator.backend", self.backend, "use 'torch' or 'vllm'")
        check(all(isinstance(s, str) and s for s in self.stop), "generator.stop", self.stop,
              "use a list of non-empty strings, e.g. generator.stop='[\"####\"]'")
        check(self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, "generator.max_prompt_tokens",
              self.max_prompt_tokens, "use null (no limit) or 1 or more")
        check(self.samples_per_item >= 0, "generator.samples_per_item", self.samples_per_item, "use 0 (none) or more")
        check(self.sample_chars >= 1, "generator.sample_chars", self.sample_chars, "use 1 or more")
        check(self.dtype in DTYPES, "generator.dtype", self.dtype, f"use one of {', '.join(DTYPES)}")
        check(self.samples_per_prompt >= 1, "generator.samples_per_prompt", self.samples_per_prompt,
               "set it to 1 or more (GRPO needs >= 2 for a non-zero advantage)")
        check(self.max_new_tokens >= 1, "generator.max_new_tokens", self.max_new_tokens, "set it to 1 or more")
        check(self.temperature > 0, "generator.temperature", self.temperature,
               "use a temperature > 0 (greedy decoding is top_p close to 0, not temperature 0)")
        check(0 < self.top_p <= 1, "generator.top_p", self.top_p, "use a value in (0, 1]")
        check(self.replicas >= 1, "generator.replicas", self.replicas, "set generator.replicas to 1 or more")


@dataclass
class TrainerConfig:
    """What every ``Trainer`` needs besides its algorithm's hyperparameters; the algorithm
    configs below extend it, so a recipe has one ``trainer`` group (``trainer.lr=...``,
    ``trainer.checkpoint_every=...``)."""

    _target_: str = "rlmesh.rl.actors.Trainer"
    """The trainer actor class this config builds; every algorithm config sets its own."""
    checkpoint_dir: str | None = None
    """Where checkpoints go. ``None``: the recipes use ``<run dir>/checkpoints`` (so every run can
    be resumed); a ``Trainer`` built by hand without one saves none (a restart then starts over)."""
    checkpoint_every: int = 1
    """Save every this many train steps (0 = only at the end). A restarted trainer rolls back to
    its newest checkpoint; what it trained since is requeued from the buffer, or dropped as stale."""
    checkpoint_keep: int = 3
    """Newest checkpoints kept on disk (older ones are deleted after each save)."""
    publish_every: int = 1
    """Publish weights to generators every this many train steps."""
    ranks: int = 1
    """Procs the trainer runs on: N > 1 spawns it as a mesh of N procs in one ``torch.distributed``
    process group (gloo on CPU, NCCL on CUDA), each training on its share of every batch
    (docs/trainer.md). 1: one proc and no process group, the trainer as it always was."""
    parallel: str = "fsdp"
    """How the model is spread over ``ranks`` > 1: ``fsdp`` (FSDP2: parameters, gradients and optimizer
    state sharded per transformer block) or ``ddp`` (a full replica per rank, gradients all-reduced).
    ``none`` only at ``ranks=1``, where nothing is spread whatever this says."""
    publish: str = "sharded"
    """How a trainer mesh (``ranks`` > 1) publishes each weight version: ``sharded``, every rank its
    own part (its FSDP2 shards), generators pulling from all ranks at once; ``gathered``, the whole
    state dict gathered to rank 0, which publishes it (docs/trainer.md, Publishing, measures both)."""
    checkpoint_format: str = "auto"
    """``auto``: a single ``step_*.pt`` file at ``ranks=1``, a sharded ``step_*.dcp`` directory
    (``torch.distributed.checkpoint``) above; ``dcp``: sharded at any rank count. Either kind
    loads at any rank count."""
    group_timeout_s: float = 300.0
    """Bound on the trainer mesh's rendezvous and on every collective (``ranks`` > 1): a rank that
    died mid-step fails its peers' step after this long instead of hanging them. Keep it above
    ``run.train_timeout_s`` (the other ranks wait that long while rank 0 samples)."""

    def rollouts_per_train(self, replicas: int) -> int:
        """Hook: rollouts (work items) one ``Trainer.train`` call waits for. Default: one per
        generator replica, the on-policy batch. An off-policy trainer may take fewer (1: update
        after every rollout that lands) and sets its own update-to-data ratio inside ``train_step``."""
        return replicas

    def __post_init__(self) -> None:
        check(self.checkpoint_every >= 0, "trainer.checkpoint_every", self.checkpoint_every, "use 0 or more")
        check(self.checkpoint_keep >= 1, "trainer.checkpoint_keep", self.checkpoint_keep, "keep at least 1 checkpoint")
        check(self.publish_every >= 1, "trainer.publish_every", self.publish_every, "use 1 or more")
        check(self.ranks >= 1, "trainer.ranks", self.ranks, "use 1 (one proc) or more")
        check(self.parallel in ("fsdp", "ddp", "none"), "trainer.parallel", self.parallel,
              "use 'fsdp' (sharded parameters and optimizer state), 'ddp' (a replica per rank) or 'none'")
        check(self.ranks == 1 or self.parallel != "none", "trainer.parallel", self.parallel,
              f"trainer.ranks={self.ranks} needs its gradients reduced: use trainer.parallel=fsdp or ddp")
        check(self.publish in ("sharded", "gathered"), "trainer.publish", self.publish,
              "use 'sharded' (every rank publishes its part) or 'gathered' (rank 0 publishes the whole model)")
        check(self.checkpoint_format in ("auto", "dcp"), "trainer.checkpoint_format", self.checkpoint_format,
              "use 'auto' (a file at ranks=1, sharded above) or 'dcp' (sharded at any rank count)")
        check(self.group_timeout_s > 0, "trainer.group_timeout_s", self.group_timeout_s,
              "use a positive number of seconds")


@dataclass
class GymTrainerConfig(TrainerConfig):
    """A trainer of the gym recipes: the env-step budget is the trainer's (schedules such as lr
    annealing run over it), and the trainer is spawned as ``cls(config, env_id, buffer, seed=...)``."""

    total_steps: int = 1_000_000
    """Env-step budget; learning-rate and clip annealing run over it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.total_steps > 0, "trainer.total_steps", self.total_steps, "set a positive step budget")
        check(self.ranks == 1, "trainer.ranks", self.ranks,
              "the gym trainers (PPO, A2C, DQN) train on one rank; trainer.ranks > 1 is for the LLM trainers "
              "(GRPO, RLOO, Dr. GRPO): use trainer.ranks=1")

    def check_batch(self, batch: int) -> None:
        """Hook: checks against the recipe's train batch (``batch`` transitions per train call)."""


@dataclass
class PPOConfig(GymTrainerConfig):
    """PPO hyperparameters (the maths, top to bottom, in :mod:`rlmesh.rl.algorithms.ppo`)."""

    _target_: str = "rlmesh.rl.algorithms.ppo.PPOTrainer"
    """The trainer actor class."""
    lr: float = 2.5e-4
    """Adam learning rate at step 0."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over ``total_steps``."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per epoch (the rollout is split evenly)."""
    clip_coef: float = 0.2
    """Policy ratio clip epsilon."""
    anneal_clip: bool = False
    """Decay ``clip_coef`` linearly to 0 with the learning rate."""
    value_clip_coef: float | None = None
    """Clip value updates to +-this; ``None`` disables value clipping."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop the epoch loop early once approx-KL exceeds this; ``None`` never stops."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    normalize_obs: bool = False
    """Normalise observations by running mean/std (statistics in the policy's state_dict, so they
    travel with the weights to generators and the evaluator and land in checkpoints)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (SB3's ``VecNormalize``)."""
    squash_actions: bool = False
    """Continuous actions: squash the Gaussian sample into the action bounds by tanh instead of
    clipping it (the flag travels in the weights to generators and the evaluator); needs finite bounds."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    use_sde: bool = False
    """Continuous actions: explore by gSDE (generalized state-dependent exploration): noise
    ``features(s) @ W`` with ``W`` held for ``sde_sample_freq`` env steps, and a per-state std, instead
    of independent noise of one learned std at every step (the flag travels in the weights)."""
    sde_sample_freq: int = -1
    """gSDE: draw a new exploration matrix every this many env steps; -1: once per rollout."""
    sde_log_std_init: float = 0.0
    """gSDE: initial log std of the exploration matrix's entries."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.lr > 0, "trainer.lr", self.lr, "use a positive learning rate, e.g. trainer.lr=3e-4")
        check(self.sde_sample_freq == -1 or self.sde_sample_freq >= 1, "trainer.sde_sample_freq",
              self.sde_sample_freq, "use -1 (once per rollout) or 1 or more env steps")
        check(0 < self.gamma <= 1, "trainer.gamma", self.gamma, "use a discount in (0, 1]")
        check(0 <= self.gae_lambda <= 1, "trainer.gae_lambda", self.gae_lambda, "use a lambda in [0, 1]")
        check(self.update_epochs >= 1, "trainer.update_epochs", self.update_epochs, "set 1 or more epochs")
        check(self.num_minibatches >= 1, "trainer.num_minibatches", self.num_minibatches, "set 1 or more")
        check(self.clip_coef > 0, "trainer.clip_coef", self.clip_coef, "use a positive clip, e.g. 0.2")
        check(self.value_clip_coef is None or self.value_clip_coef > 0, "trainer.value_clip_coef",
               self.value_clip_coef, "use a positive value or null to disable value clipping")
        check(self.max_grad_norm > 0, "trainer.max_grad_norm", self.max_grad_norm, "use a positive norm")
        check(self.target_kl is None or self.target_kl > 0, "trainer.target_kl", self.target_kl,
               "use a positive KL or null to disable early stopping")

    def check_batch(self, batch: int) -> None:
        check(batch >= self.num_minibatches, "trainer.num_minibatches", self.num_minibatches,
              f"a rollout batch of {batch} transitions cannot be split into more minibatches than that")


@dataclass
class GRPOConfig(TrainerConfig):
    """GRPO hyperparameters (the maths in :mod:`rlmesh.rl.algorithms.grpo`)."""

    _target_: str = "rlmesh.rl.algorithms.grpo.GRPOTrainer"
    """The trainer actor class (spawned as ``cls(config, buffer, model_config, model_path, task,
    temperature, pad_id, seed=..., dtype=..., gradient_checkpointing=...)``)."""
    lr: float = 1e-4
    """Adam learning rate."""
    clip_coef: float = 0.2
    """Lower ratio-clip epsilon."""
    clip_coef_high: float | None = None
    """Upper ratio-clip epsilon (DAPO's clip-higher); ``None`` = ``clip_coef``."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the reference policy; 0 skips the reference model."""
    normalize_std: bool = True
    """Divide group-centred rewards by the group's std (``False``: Dr. GRPO)."""
    aggregation: str = "token_mean"
    """How token losses are averaged: ``token_mean`` (every token of the batch weighs the same, DAPO),
    ``sequence_mean`` (each sequence's mean, the GRPO paper) or ``sequence_sum_norm`` (each sequence's
    sum over ``norm_length``, Dr. GRPO: no length bias)."""
    norm_length: int | None = None
    """The constant ``sequence_sum_norm`` divides by: the generation budget (``generator.max_new_tokens``);
    ``None`` = the batch's padded completion width."""
    update_epochs: int = 1
    """Passes over each batch of completions (1 = on-policy, ratio is 1 at the first step)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    max_groups: int | None = None
    """Train on at most this many informative groups per step (DAPO's dynamic sampling:
    generate more prompts than this and keep a full batch of signal); ``None`` = all."""
    sft_steps: int = 0
    """Supervised warm-start steps on the task format before the first weights are published
    (stands in for a pretrained LM; see :func:`rlmesh.rl.algorithms.grpo.sft_warmstart`); 0 = none."""
    sft_lr: float = 1e-3
    """Learning rate of the warm start."""
    micro_batch_size: Optional[int] = None
    """Completions per forward/backward pass; the step accumulates the gradients of all of them
    (same update, less memory). ``None``: the whole batch at once."""
    lr_schedule: str = "constant"
    """``constant``, or ``linear`` / ``cosine`` decay to 0 at ``lr_decay_steps``."""
    warmup_steps: int = 0
    """Train steps of linear learning-rate warm-up from 0."""
    lr_decay_steps: Optional[int] = None
    """Where a decaying schedule reaches 0; ``None``: the recipe's ``steps``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.micro_batch_size is None or self.micro_batch_size >= 1, "trainer.micro_batch_size",
              self.micro_batch_size, "use null (the whole batch) or 1 or more completions")
        check(self.lr_schedule in ("constant", "linear", "cosine"), "trainer.lr_schedule", self.lr_schedule,
              "use 'constant', 'linear' or 'cosine'")
        check(self.warmup_steps >= 0, "trainer.warmup_steps", self.warmup_steps, "use 0 or more")
        check(self.lr_decay_steps is None or self.lr_decay_steps > self.warmup_steps, "trainer.lr_decay_steps",
              self.lr_decay_steps, f"use null or a step after trainer.warmup_steps ({self.warmup_steps})")
        check(self.max_groups is None or self.max_groups >= 1, "trainer.max_groups", self.max_groups,
              "use null (all informative groups) or 1 or more")
        check(self.sft_steps >= 0, "trainer.sft_steps", self.sft_steps, "use 0 (no warm start) or more")
        check(self.lr > 0, "trainer.lr", self.lr, "use a positive learning rate")
        check(self.clip_coef > 0, "trainer.clip_coef", self.clip_coef, "use a positive clip, e.g. 0.2")
        check(self.clip_coef_high is None or self.clip_coef_high >= self.clip_coef, "trainer.clip_coef_high",
               self.clip_coef_high, f"use null or a value >= trainer.clip_coef ({self.clip_coef})")
        check(self.kl_coef >= 0, "trainer.kl_coef", self.kl_coef, "use 0 (no reference model) or a positive weight")
        check(self.aggregation in ("token_mean", "sequence_mean", "sequence_sum_norm"), "trainer.aggregation",
              self.aggregation, "use 'token_mean', 'sequence_mean' or 'sequence_sum_norm' (Dr. GRPO)")
        check(self.norm_length is None or self.norm_length >= 1, "trainer.norm_length", self.norm_length,
              "use null (the padded completion width) or the generation budget, e.g. generator.max_new_tokens")
        check(self.update_epochs >= 1, "trainer.update_epochs", self.update_epochs, "set 1 or more epochs")
        check(self.max_grad_norm > 0, "trainer.max_grad_norm", self.max_grad_norm, "use a positive norm")


@dataclass
class RewardConfig:
    """Which reward a ``RewardActor`` computes."""

    _target_: str = "rlmesh.rl.actors.RewardActor"
    """The reward actor class (spawned as ``cls(config)``); a learned reward model is a subclass."""
    kind: str = "env"
    """``env``: pass the environment's return through; ``exact_match`` / ``numeric`` / ``math`` (a
    math completion's final answer, GSM8K's ``####`` format included): verifiers from
    :mod:`rlmesh.rl.tasks.verifiers`; ``model``: a learned reward model, supplied by a
    ``RewardActor`` subclass that overrides ``reward_model`` (docs/extending.md)."""
    replicas: int = 1
    """Reward actors."""
    format_reward: float = 0.0
    """Partial credit for a well-formed but wrong answer (verifiers only)."""

    def __post_init__(self) -> None:
        check(self.kind in ("env", "exact_match", "numeric", "math", "model"), "reward.kind", self.kind,
               "use 'env', 'exact_match', 'numeric', 'math' or 'model' (a RewardActor subclass overriding "
               "reward_model)")
        check(self.replicas >= 1, "reward.replicas", self.replicas, "set reward.replicas to 1 or more")
        check(0 <= self.format_reward < 1, "reward.format_reward", self.format_reward,
               "use a value in [0, 1): it must stay below a correct answer's reward of 1")


@dataclass
class BufferConfig:
    """The replay buffer's capacity and staleness bound."""

    _target_: str = "rlmesh.rl.actors.ReplayBuffer"
    """The buffer actor class (spawned as ``cls(config)``)."""
    capacity: int = 1024
    """Rollouts held at most; the oldest are evicted (and reported) beyond it."""
    max_policy_lag: int = 0
    """How many versions behind the trainer a sampled rollout may be; 0 = strictly on-policy."""

    def __post_init__(self) -> None:
        check(self.capacity >= 1, "buffer.capacity", self.capacity, "set buffer.capacity to 1 or more")
        check(self.max_policy_lag >= 0, "buffer.max_policy_lag", self.max_policy_lag,
               "use 0 (on-policy) or a positive number of versions")


@dataclass
class ReplayConfig(BufferConfig):
    """The off-policy replay ring (``buffer=transitions``): a ``BufferConfig`` whose capacity counts
    transitions, for :class:`~rlmesh.rl.actors.TransitionBuffer`."""

    _target_: str = "rlmesh.rl.actors.TransitionBuffer"
    """The buffer actor class."""

    capacity: int = 100_000
    """Transitions held; the oldest are overwritten beyond it."""
    max_policy_lag: int = 1
    """How many versions generation may run ahead of training (the work scheduler's credit).
    Unlike the on-policy buffer nothing is dropped as stale: old data is the point."""

    def __post_init__(self) -> None:
        super().__post_init__()
