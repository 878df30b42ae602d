"""A new algorithm in ~40 lines: RLOO (REINFORCE leave-one-out) as a ``GRPOTrainer`` subclass.

RLOO differs from GRPO in one place, the advantage: each completion's baseline is the mean
reward of the *other* completions of its prompt (Kool et al. 2019; Ahmadian et al. 2024).
So the subclass overrides one hook, ``compute_advantages``, and brings its own config
dataclass (a field docstring each, checks in ``__post_init__``). Everything else (actors,
procs, weight sync, telemetry, evaluation) is the ``grpo`` recipe, unchanged.

    python examples/rloo_addition.py                       # the grpo_addition recipe, RLOO advantages
    python examples/rloo_addition.py steps=50 trainer.sft_steps=100 eval.every=10
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch

from rlmesh.errors import ConfigError
from rlmesh.recipes.compose import RecipeConfigError, compose, load_program
from rlmesh.rl.actors import GRPOTrainer
from rlmesh.rl.config import GRPOConfig
from rlmesh.rl.losses import rloo_advantages


@dataclass
class RLOOConfig(GRPOConfig):
    """GRPO's settings plus RLOO's one choice."""

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


def main(argv: list[str]) -> dict:
    try:
        cfg, launcher = compose(["recipe=grpo_addition", *argv])
    except RecipeConfigError as exc:
        raise SystemExit(f"config error: {exc}") from exc
    cfg.trainer = RLOOConfig(**asdict(cfg.trainer))           # same values, RLOO's extra fields at their defaults
    return load_program("grpo").main(cfg, launcher, trainer_cls=RLOOTrainer)


if __name__ == "__main__":
    main(sys.argv[1:])
