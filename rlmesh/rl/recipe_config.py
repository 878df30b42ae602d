"""Complete experiment configs: one dataclass per recipe, composed of the component
configs of :mod:`rlmesh.rl.config`, plus the tuned presets the benchmarks measure.

Cross-field checks ("impossible combinations") live here, in the recipe's
``__post_init__``, because only the recipe sees all the groups at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlmesh.rl.config import (
    BufferConfig,
    GRPOConfig,
    GymGeneratorConfig,
    LLMGeneratorConfig,
    PPOConfig,
    RewardConfig,
    check,
)


@dataclass
class PPORecipeConfig:
    """A complete PPO experiment: generator, trainer, buffer."""

    generator: GymGeneratorConfig = field(default_factory=GymGeneratorConfig)
    trainer: PPOConfig = field(default_factory=PPOConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)

    def __post_init__(self) -> None:
        batch = self.generator.num_envs * self.generator.num_steps * self.generator.replicas
        check(batch >= self.trainer.num_minibatches, "trainer.num_minibatches", self.trainer.num_minibatches,
               f"a rollout batch of {batch} transitions cannot be split into more minibatches than that")


def ppo_cartpole() -> PPORecipeConfig:
    """The tuned CartPole-v1 preset (``recipe=ppo_cartpole``), measured by
    ``benchmarks/cartpole_vs_sb3.py``: rl-zoo's gamma/lambda and linear lr+clip decay, but
    rollouts of 8 envs x 64 steps cut into 4 minibatches for 10 epochs at lr 2e-3
    (40 gradient steps per 512 transitions, on 128-sample minibatches)."""
    return PPORecipeConfig(
        generator=GymGeneratorConfig(env_id="CartPole-v1", num_envs=8, num_steps=64),
        trainer=PPOConfig(total_steps=100_000, lr=2e-3, anneal_lr=True, gamma=0.98, gae_lambda=0.8, update_epochs=10,
                      num_minibatches=4, clip_coef=0.2, anneal_clip=True, entropy_coef=0.0),
    )


@dataclass
class GRPORecipeConfig:
    """A complete GRPO experiment: LLM generator, reward, trainer, buffer."""

    generator: LLMGeneratorConfig = field(default_factory=LLMGeneratorConfig)
    reward: RewardConfig = field(default_factory=lambda: RewardConfig(kind="exact_match"))
    trainer: GRPOConfig = field(default_factory=GRPOConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)

    def __post_init__(self) -> None:
        check(self.reward.kind != "env", "reward.kind", self.reward.kind,
               "GRPO on text needs a verifier: use 'exact_match' or 'numeric'")
        check(self.generator.samples_per_prompt >= 2, "generator.samples_per_prompt",
               self.generator.samples_per_prompt, "GRPO's group baseline needs at least 2 samples per prompt")
