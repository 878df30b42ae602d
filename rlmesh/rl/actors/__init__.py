"""The RL actors: generators, reward actors, the replay buffer and trainers.

A file per concept; every class is an ``rm.Actor`` to spawn on a proc mesh, and every
extension point is a named hook whose docstring says when it runs (docs/extending.md).
Imported lazily so ``import rlmesh.rl.actors`` does not load gymnasium or the models.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Generator": "generator",
    "GymGenerator": "gym_generator",
    "LLMGenerator": "llm_generator",
    "RewardActor": "reward",
    "ReplayBuffer": "replay_buffer",
    "TransitionBuffer": "transition_buffer",
    "Trainer": "trainer",
}

_ALIASES = {"PPOTrainer": "rlmesh.rl.algorithms.ppo", "GRPOTrainer": "rlmesh.rl.algorithms.grpo"}
"""Trainers that live with their algorithm's maths (rlmesh/rl/algorithms/), still importable from
here by their old name; resolved lazily, so this package does not depend on the algorithms."""

__all__ = sorted([*_NAMES, *_ALIASES])  # noqa: PLE0605 - a list, built from the two tables


def __getattr__(name: str) -> Any:
    if name in _NAMES or name in _ALIASES:
        module = _ALIASES.get(name) or f"rlmesh.rl.actors.{_NAMES[name]}"
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlmesh.rl.actors' has no attribute {name!r}")
