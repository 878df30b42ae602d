"""What the RL actors answer the controller with: small typed records instead of string-keyed dicts.

They cross processes (pickled), so they are plain dataclasses of plain values; the controller
loop (:mod:`rlmesh.recipes.loop`), :class:`rlmesh.rl.run.resilience.Recovery` and tests read their
attributes, and a typo is an ``AttributeError`` at the line that made it, not a ``KeyError``
(or worse, a ``.get`` default) three modules away.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainerState:
    """A trainer's counters (``Trainer.state``): where a resumed or restarted trainer stands."""

    step: int
    """Train steps taken."""
    policy_version: int
    """Newest weight version published."""
    samples_seen: int
    """Samples trained on so far (transitions or completions)."""


@dataclass
class TrainResult(TrainerState):
    """One ``Trainer.train`` call: what was trained (if anything) and the work it settles.

    ``trained`` is false when the buffer had not enough fresh rollouts within the timeout; the
    controller then issues more work. ``rollout_ids`` were consumed by this step, ``dropped`` were
    refused as stale by the buffer (with ``drop_reasons``), ``requeued`` came back from a dead
    trainer's lease: the controller's work ledger settles all four.
    """

    trained: bool = False
    samples: int = 0
    """Samples in this step's batch."""
    max_lag: int = 0
    """Oldest rollout's lag behind the trainer, in versions."""
    duration_s: float = 0.0
    """Wall time of the step (train_step, publish, checkpoint)."""
    lr: float = 0.0
    """Learning rate of the step."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The algorithm's namespaced metrics (``losses/loss``, ``charts/episodic_return``, ``rollout/reward_mean``)."""
    rollout_ids: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    drop_reasons: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)

    def metric(self, name: str, default: float | None = None) -> float | None:
        """``metrics[name]``, or ``default`` when this algorithm does not report it."""
        return self.metrics.get(name, default)


@dataclass
class EvalResult:
    """One evaluation of a weight version (also an ``evals`` telemetry row)."""

    metric: str
    """``mean_return`` (gym) or ``mean_reward`` (LLM)."""
    value: float
    policy_version: int
    episodes: int
    """Episodes (gym) or held-out prompts (LLM) it averaged over."""
