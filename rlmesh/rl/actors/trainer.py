"""``Trainer``: the base of every learner actor.

It owns what all algorithms share: the model and optimiser (built by hooks), the step
and weight-version counters, sampling batches from the ``ReplayBuffer`` (peer to peer),
publishing weights through :mod:`rlmesh.weights`, checkpoints (model, optimiser, RNG
states, step, version and whatever :meth:`Trainer.checkpoint_extra` adds) and one
``train_steps`` telemetry row per step. An algorithm implements :meth:`train_step`.

Version semantics: the published version is the number of train steps taken, so a
rollout's lag is simply ``trainer step - rollout version`` (after rolling a live trainer back
to an older checkpoint, versions keep counting up from the newest one instead: they never repeat). Version 0 (the initial
weights) is published from ``__init__``; generators block on it before their first rollout.

Restarts: with a ``checkpoint_dir``, a restarted trainer proc (``rm.Restart``) reloads the
newest checkpoint in ``__init__`` (skipping :meth:`setup`, whose result the checkpoint holds)
and republishes, so generators follow it. The checkpoint holds the **buffer cursor** (the
lease of the last batch trained, see :meth:`rlmesh.rl.buffer.ReplayBufferCore.settle`): the
buffer gives back whatever the dead incarnation sampled after it. The newest version
ever published is kept in the runtime's KV, so a restarted trainer publishes past it and a
generator never loads a version older than the one it holds.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import rlmesh as rm
from rlmesh.actor import kv
from rlmesh.rl import checkpoint
from rlmesh.rl.config import TrainerConfig
from rlmesh.rl.results import TrainerState, TrainResult
from rlmesh.weights import Publisher

logger = logging.getLogger(__name__)


class Trainer(rm.Actor):
    """Base trainer. Subclasses implement :meth:`build_model`, :meth:`build_optimizer` and :meth:`train_step`.

    Args:
        config: a :class:`~rlmesh.rl.config.TrainerConfig` (or an algorithm config extending it).
        buffer: the ``ReplayBuffer`` actor mesh to sample from (``None``: call :meth:`train_step` directly).
        weights: name the weights are published under.
        seed: seeds torch, numpy and ``random`` in this proc.
    """

    def __init__(self, config: TrainerConfig, buffer: Any = None, weights: str = "policy", seed: int = 0) -> None:
        torch.set_num_threads(1)
        self.config, self.buffer, self.seed = config, buffer, seed
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        self.step = 0
        self.version = 0
        self.samples_seen = 0
        """Samples trained on so far (transitions or completions): drives schedules such as lr annealing."""
        self.cursor = 0
        """Buffer cursor: the lease id of the last batch trained (0 = none yet)."""
        self.durable_cursor = 0
        """The cursor the newest checkpoint holds: the buffer may forget leases up to it."""
        self.weights = weights
        self.model = self.build_model()
        self.publisher = Publisher(weights)
        self.publisher.reserve(self.model.state_dict())  # shm slots reserved while the optimiser and setup build
        self.optimizer = self.build_optimizer()
        newest = self.newest_checkpoint()
        if newest is None:
            self.setup()
            self.publish()
        else:
            self.load_checkpoint(newest)

    # -- hooks -------------------------------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        """Hook: the policy network (runs once, in ``__init__``, before the optimiser)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_model()")

    def build_optimizer(self) -> torch.optim.Optimizer:
        """Hook: the optimiser over ``self.model`` (runs once, right after :meth:`build_model`)."""
        return torch.optim.Adam(self.model.parameters(), lr=getattr(self.config, "lr", 1e-3))

    def setup(self) -> None:
        """Hook: runs once after model and optimiser exist and before version 0 is published
        (a warm start, a frozen reference copy). Not run again after a checkpoint reload."""

    def train_step(self, batch: list[Any]) -> dict[str, float]:
        """Hook: one optimiser step (or several minibatch steps) on ``batch``, the payloads of
        the sampled rollouts, oldest first. Returns namespaced metrics (``losses/*``, ``train/*``).

        May assume every item is within ``max_policy_lag`` versions of ``self.version``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement train_step()")

    def samples_in(self, batch: list[Any]) -> int:
        """Hook: how many samples ``batch`` holds (for ``train_steps.samples`` and schedules)."""
        return len(batch)

    def checkpoint_extra(self) -> dict[str, Any]:
        """Hook: extra state to save with a checkpoint (returned to :meth:`restore_extra`)."""
        return {}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        """Hook: restore what :meth:`checkpoint_extra` saved."""

    # -- endpoints ---------------------------------------------------------------------------------------------

    @rm.endpoint
    def train(self, batch_size: int, timeout: float = 60.0) -> TrainResult:
        """Sample ``batch_size`` fresh rollouts from the buffer, run :meth:`train_step`, publish.

        Returns ``trained=False`` (with the drops) when the buffer had not enough fresh
        rollouts within ``timeout``; the controller then issues more work and calls again.
        """
        if self.buffer is None:
            raise RuntimeError(f"{type(self).__name__} was built without a buffer; call train_step() directly")
        res = self.buffer.sample.call_one(batch_size, self.version, timeout, self.cursor, self.durable_cursor).get()
        if not res.rollouts:
            out = TrainResult(self.step, self.version, self.samples_seen)
        else:
            out = self.learn([r.data for r in res.rollouts], max_lag=res.max_lag or 0, cursor=res.lease)
            out.rollout_ids = [r.rollout_id for r in res.rollouts]
        out.dropped, out.drop_reasons = [d.rollout_id for d in res.dropped], [d.reason for d in res.dropped]
        out.requeued = list(res.requeued)
        return out

    def learn(self, batch: list[Any], max_lag: int = 0, cursor: int | None = None) -> TrainResult:
        """:meth:`train_step` plus the bookkeeping: counters, buffer cursor, publish, checkpoint, telemetry."""
        t0 = time.perf_counter()
        samples = self.samples_in(batch)
        metrics = self.train_step(batch)
        self.step += 1
        self.samples_seen += samples
        if cursor is not None:
            self.cursor = cursor
        if self.step % self.config.publish_every == 0:
            self.publish()
        every = self.config.checkpoint_every
        if self.config.checkpoint_dir and every and self.step % every == 0:
            self.save_checkpoint()
        took = time.perf_counter() - t0
        lr = float(self.optimizer.param_groups[0]["lr"])
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["train/policy_lag"] = float(max_lag)
        rm.telemetry.record("train_steps", step=self.step, policy_version=self.version,
                            loss=metrics.get("losses/loss"), lr=lr, grad_norm=metrics.get("train/grad_norm"),
                            samples=samples, duration_s=took, metrics=json.dumps(metrics))
        return TrainResult(self.step, self.version, self.samples_seen, trained=True, samples=samples, max_lag=max_lag,
                           duration_s=took, lr=lr, metrics=metrics)

    @rm.endpoint
    def save(self, path: str | None = None) -> str:
        """Write a checkpoint now (to ``path`` or ``checkpoint_dir``); returns its path."""
        return str(self.save_checkpoint(path))

    @rm.endpoint
    def load(self, path: str) -> int:
        """Load a checkpoint file and republish; returns the restored step."""
        self.load_checkpoint(path)
        return self.step

    @rm.endpoint
    def state(self) -> TrainerState:
        """Step, version and samples seen (cheap; for the controller and tests)."""
        return TrainerState(self.step, self.version, self.samples_seen)

    def on_restart(self) -> None:
        """Runs after ``__init__`` in a replacement proc, which already reloaded the newest checkpoint."""
        logger.info("%s restarted at step %d (version %d, buffer cursor %d)", type(self).__name__, self.step,
                    self.version, self.cursor)

    def on_stop(self) -> None:
        if self.config.checkpoint_dir:
            self.save_checkpoint()
        self.publisher.close()

    # -- weights and checkpoints -------------------------------------------------------------------------------

    def publish(self) -> None:
        """Publish ``self.model``'s weights as version ``self.step``, or one past the newest version
        this job ever published under the name (a checkpoint rolled the trainer back, or a
        restarted proc resumed from one): versions never repeat and never go down."""
        newest = self._newest_published()
        self.version = self.step if newest is None or self.step > newest else newest + 1
        kv.put(self._version_key(), self.version)  # first: a kill mid-publish must not let a version number repeat
        self.publisher.publish(self.model.state_dict(), version=self.version)

    def _version_key(self) -> str:
        return f"rlmesh.rl/weights/{self.weights}/newest_version"

    def _newest_published(self) -> int | None:
        """The KV's reservation: :meth:`publish` puts every version there before publishing it."""
        try:
            return int(kv.get(self._version_key(), timeout=0))
        except KeyError:
            return None

    def save_checkpoint(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Atomically write model, optimiser, RNG states, counters and :meth:`checkpoint_extra`
        (tensors and plain values only: see :mod:`rlmesh.rl.checkpoint`)."""
        if path is None:
            if not self.config.checkpoint_dir:
                raise rm.ConfigError("trainer.checkpoint_dir is not set; set it to save checkpoints")
            path = Path(self.config.checkpoint_dir) / checkpoint.name_for(self.step)
        path = Path(path)
        t0 = time.perf_counter()
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                 "version": self.version, "samples_seen": self.samples_seen, "buffer_cursor": self.cursor,
                 "rng": checkpoint.rng_state(), "extra": self.checkpoint_extra()}
        checkpoint.write(path, state, self.step, self.version)
        self.durable_cursor = self.cursor
        checkpoint.prune(path.parent, getattr(self.config, "checkpoint_keep", 3))
        self._record_checkpoint("save", path, time.perf_counter() - t0)
        return path

    def _record_checkpoint(self, event: str, path: Path, took: float) -> None:
        size = path.stat().st_size if path.exists() else None
        rm.telemetry.record("checkpoints", event=event, step=self.step, policy_version=self.version, path=str(path),
                            bytes=size, buffer_cursor=self.cursor, duration_s=took)

    def newest_checkpoint(self) -> Path | None:
        """The newest ``step_*.pt`` with its checksum file in ``checkpoint_dir`` (``None`` if none)."""
        return checkpoint.newest(Path(self.config.checkpoint_dir) if self.config.checkpoint_dir else None)

    def load_checkpoint(self, path: str | os.PathLike[str] | None = None) -> bool:
        """Restore from ``path``, or the newest ``step_*.pt`` in ``checkpoint_dir``; republish.
        Returns ``False`` when there is nothing to load; raises :class:`~rlmesh.rl.checkpoint.CheckpointError`
        for a file that fails its checksum or holds more than tensors and plain values."""
        t0 = time.perf_counter()
        path = Path(path) if path is not None else self.newest_checkpoint()
        if path is None:
            return False
        state = checkpoint.read(path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.samples_seen = int(state["step"]), int(state["samples_seen"])
        self.cursor = self.durable_cursor = int(state.get("buffer_cursor", 0))
        checkpoint.set_rng_state(state["rng"])
        self.restore_extra(state.get("extra", {}))
        self.publish()
        took = time.perf_counter() - t0
        logger.info("loaded checkpoint %s (step %d, buffer cursor %d) in %.3f s", path, self.step, self.cursor, took)
        self._record_checkpoint("load", path, took)
        return True
