"""GRPO's config (:class:`~rlmesh.rl.config.GRPOConfig`) as ``trainer/grpo``.

The class lives in :mod:`rlmesh.rl.config` because every LLM recipe's schema declares it; this module
only registers it, the way a plugin registers its own.
"""

from __future__ import annotations

from typing import Any

from rlmesh.rl.config import GRPOConfig

__all__ = ["register"]


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store ``trainer/grpo``."""
    cs.store(group="trainer", name="grpo", node=GRPOConfig)
