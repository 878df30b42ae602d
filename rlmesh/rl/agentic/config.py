"""Settings of an agentic generator and of its environment mesh."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlmesh.rl.config import LLMGeneratorConfig, check


@dataclass
class AgenticGeneratorConfig(LLMGeneratorConfig):
    """An ``LLMGenerator`` that runs multi-turn episodes (``samples_per_prompt`` episodes per task)."""

    _target_: str = "rlmesh.rl.agentic.generator.AgenticGenerator"
    max_turns: int = 4
    """Model turns per episode."""
    max_episode_tokens: int = 64
    """Tokens after the prompt, model and observation tokens together."""
    max_batch: int = 0
    """Episodes per generation call; 0: every episode that is ready. Set it below the episodes of a
    work item (``samples_per_prompt`` x prompts) to keep more episodes in flight than one batch: one
    cohort generates while the other's tools run, so tool latency no longer idles the model."""
    partial_rollouts: bool = True
    """Between turns, pull newer weights if the trainer published some: a long episode continues
    with the new policy instead of finishing on the old one (each segment records its version)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_turns >= 1, "generator.max_turns", self.max_turns, "set it to 1 or more")
        check(self.max_batch >= 0, "generator.max_batch", self.max_batch,
              "use 0 (every ready episode in one call) or a positive batch size")
        check(self.max_episode_tokens >= self.max_new_tokens, "generator.max_episode_tokens",
              self.max_episode_tokens, f"use at least generator.max_new_tokens={self.max_new_tokens} (one turn)")


@dataclass
class EnvConfig:
    """The ``env`` mesh: which ``TextEnv`` and how many actors host its episodes."""

    cls: str = "rlmesh.rl.agentic.calculator:CalculatorEnv"
    """The environment class, ``package.module:ClassName``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Its constructor's arguments (one instance per episode)."""
    replicas: int = 1
    """Env actors, one proc each."""
    max_workers: int = 32
    """Episodes one env actor steps at once."""

    def __post_init__(self) -> None:
        check(":" in self.cls, "env.cls", self.cls, "name the class as 'package.module:ClassName'")
        check(self.replicas >= 1, "env.replicas", self.replicas, "set env.replicas to 1 or more")
        check(self.max_workers >= 1, "env.max_workers", self.max_workers, "set it to 1 or more")
