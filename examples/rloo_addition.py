"""A new algorithm in ~40 lines: RLOO (REINFORCE leave-one-out) as a ``GRPOTrainer`` subclass.

RLOO differs from GRPO in one place, the advantage: each completion's baseline is the mean
reward of the *other* completions of its prompt (Kool et al. 2019; Ahmadian et al. 2024).
So the subclass overrides one hook, ``compute_advantages``, and brings its own config
dataclass (a field docstring each, checks in ``__post_init__``, its actor class in ``_target_``).
:func:`register` stores that config in Hydra's ConfigStore as ``trainer/rloo_example``, which is
all it takes for the ``grpo`` recipe to spawn ``RLOOTrainer`` and for ``trainer.scale_by_std=...``
to be a command-line setting. Everything else (actors, procs, weight sync, telemetry, evaluation)
is the ``grpo`` recipe, unchanged. (An installed package does the same through the
``rlmesh.algorithms`` entry point group, docs/extending.md.)

    python examples/rloo_addition.py                       # the grpo_addition recipe, RLOO advantages
    python examples/rloo_addition.py steps=50 trainer.sft_steps=100 eval.every=10 trainer.scale_by_std=true
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from hydra.core.config_store import ConfigStore

from rlmesh.errors import ConfigError
from rlmesh.recipes.cli import run_main
from rlmesh.rl.algorithms.grpo import GRPOTrainer
from rlmesh.rl.config import GRPOConfig
from rlmesh.rl.losses import rloo_advantages


@dataclass
class RLOOConfig(GRPOConfig):
    """GRPO's settings plus RLOO's one choice."""

    _target_: str = f"{__name__}.RLOOTrainer"
    """The trainer class this config builds (``__main__.RLOOTrainer`` when run as a script)."""
    scale_by_std: bool = False
    """Divide the leave-one-out advantages by the batch's std (off in the paper)."""
    min_std: float = 1e-6
    """Floor of that std, so a batch of near-identical rewards does not blow up."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_std <= 0:
            raise ConfigError(f"trainer.min_std={self.min_std!r} is invalid: use a small positive floor, e.g. 1e-6")


class RLOOTrainer(GRPOTrainer):
    """GRPO's loss with RLOO's baseline: the only difference is this hook."""

    config: RLOOConfig

    def compute_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        adv = rloo_advantages(rewards, group_size)
        if self.config.scale_by_std:
            adv = adv / adv.std().clamp_min(self.config.min_std)
        return adv


def register(cs: ConfigStore) -> None:
    """Store RLOO's config as ``trainer/rloo_example``, with the grpo_addition preset's tuned values
    (the shape of an ``rlmesh.algorithms`` entry point's function)."""
    cs.store(group="trainer", name="rloo_example", node=RLOOConfig(lr=5e-4, max_groups=32, sft_steps=500))


def main(argv: list[str]) -> int:
    """``rlmesh run recipe=grpo_addition trainer=rloo_example ...``, in this process (so the classes
    above are importable as ``__main__.*``)."""
    register(ConfigStore.instance())
    return run_main(["recipe=grpo_addition", "trainer=rloo_example", *argv])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
