"""``LossOutput``: what every loss function of :mod:`rlmesh.rl.algorithms` returns.

One base for all of them (PPO, A2C, GRPO and its variants), so an update loop needs to know
only two things of a loss: ``.loss`` to backpropagate and ``.metrics()`` to log. Each loss adds
its diagnostics as further 0-d tensor fields; ``metrics()`` names them ``losses/<field>``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class LossOutput:
    """The scalar loss to backpropagate; subclasses add their parts and diagnostics (0-d tensors)."""

    loss: torch.Tensor

    def metrics(self) -> dict[str, float]:
        """Every field as a namespaced float for logging/telemetry (``losses/<field>``)."""
        return {f"losses/{f.name}": float(getattr(self, f.name).detach()) for f in fields(self)}
