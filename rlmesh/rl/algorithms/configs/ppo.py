"""PPO's config (:class:`~rlmesh.rl.config.PPOConfig`) as ``trainer/ppo``.

The class lives in :mod:`rlmesh.rl.config` because every gym recipe's schema declares it; this module
only registers it, the way a plugin registers its own.
"""

from __future__ import annotations

from typing import Any

from rlmesh.rl.config import PPOConfig

__all__ = ["register"]


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store ``trainer/ppo``."""
    cs.store(group="trainer", name="ppo", node=PPOConfig)
