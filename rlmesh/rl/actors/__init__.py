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
    "PPOTrainer": "ppo_trainer",
    "GRPOTrainer": "grpo_trainer",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(f"rlmesh.rl.actors.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlmesh.rl.actors' has no attribute {name!r}")
