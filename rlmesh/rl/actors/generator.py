"""``Generator``: the base of every actor that turns a policy into rollouts.

It owns the two things all generators share: the policy's **weight version** (pulled
through :mod:`rlmesh.weights`, newest first) and the hand-off to the ``ReplayBuffer``
actor, peer to peer. Every rollout is tagged with the version that produced it and with
the id of the work item it answers (``WorkItem.work_id``), so work re-issued after a
generator death is recognised as a duplicate by the buffer and never counted twice.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

import rlmesh as rm
from rlmesh.errors import WeightSyncError
from rlmesh.rl.results import EvalResult
from rlmesh.weights import Subscriber

logger = logging.getLogger(__name__)


class Generator(rm.Actor):
    """Base generator. Subclasses implement :meth:`weight_target` and their own endpoints.

    Args:
        buffer: the ``ReplayBuffer`` actor mesh rollouts go to (``None`` for an evaluator).
        weights: name of the published weights to follow.
    """

    def __init__(self, buffer: Any = None, weights: str = "policy") -> None:
        torch.set_num_threads(1)  # generators share cores with the trainer
        self.buffer = buffer
        self.weights = weights
        self.version = -1
        """Weight version currently loaded (-1 before the first pull)."""
        self._sub = Subscriber(weights)
        self._sub.prepare()  # a trainer already up: map its weight slots now, so the first pull only copies
        self._evaluated: dict[int, EvalResult] = {}
        """Evaluations this actor made, by weight version (one per version, see :meth:`evaluation`)."""

    # -- hooks -------------------------------------------------------------------------------------------------

    def weight_target(self) -> Any:
        """Hook: the tensors ``pull_into`` overwrites in place (a state_dict or a module).

        Called before every pull; the default raises so a subclass cannot forget it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement weight_target()")

    def on_weights(self, version: int) -> None:
        """Hook: runs right after new weights (``version``) were copied in. Default: nothing."""

    # -- shared behaviour --------------------------------------------------------------------------------------

    def sync_weights(self, min_version: int = 0, timeout: float = 120.0) -> int:
        """Make sure the policy is at least ``min_version``, pulling the newest published one if it is newer.

        Blocks (up to ``timeout``) while the trainer has not published ``min_version`` yet:
        that wait is what bounds the policy lag (see :mod:`rlmesh.rl.run.schedule`).
        """
        try:
            latest = self._sub.latest_version(timeout=1.0 if self.version >= min_version else None)
        except WeightSyncError:
            if self.version < min_version:
                raise
            latest = None  # the publisher is gone (its trainer is restarting): go on with the weights we hold
        if self.version >= min_version and (latest is None or latest <= self.version):
            return self.version
        floor = max(0, min_version, self.version)  # never load a version older than the one held
        target = self.weight_target()
        if target is None:  # engine takes whole state dicts only (a backend without in-place tensors)
            sd, v = self._sub.pull(min_version=floor, timeout=timeout)
            self.load_state_dict(sd)
        else:
            v = self._sub.pull_into(target, min_version=floor, timeout=timeout)
        self.version = int(v)
        self.on_weights(self.version)
        return self.version

    def evaluation(self, min_version: int, env_steps: int | None,
                   measure: Callable[[], tuple[str, float, int]]) -> EvalResult:
        """Evaluate the newest weights >= ``min_version`` with ``measure() -> (metric, value, episodes)``
        and write its ``evals`` row, **once per version**: asked again for a version it already
        evaluated (two requests racing a publish, a final evaluation after the periodic one), it
        answers the same result and writes no second row."""
        self.sync_weights(min_version)
        done = self._evaluated.get(self.version)
        if done is not None:
            return done
        t0 = time.perf_counter()
        metric, value, episodes = measure()
        result = EvalResult(metric, float(value), self.version, episodes)
        rm.telemetry.record("evals", step=self.version, policy_version=self.version, metric=metric, value=result.value,
                            episodes=episodes, env_steps=env_steps, duration_s=time.perf_counter() - t0)
        self._evaluated[self.version] = result
        return result

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Hook for engines without in-place targets (``weight_target() is None``)."""
        raise NotImplementedError(f"{type(self).__name__}: weight_target() is None, so implement load_state_dict()")

    def submit(self, rollout_id: str, data: Any, num_samples: int) -> str:
        """Hand a rollout to the buffer (peer to peer). Returns ``""`` if accepted, else the
        buffer's reason (``"duplicate"`` for re-issued work whose original landed, ``"stale"``)."""
        if self.buffer is None:
            return ""
        return str(self.buffer.add.call_one(rollout_id, self.version, data, num_samples).get())

    def on_stop(self) -> None:
        self._sub.close()
