"""``Trainer``: the base of every learner actor.

It owns what all algorithms share: the model and optimiser (built by hooks), the step
and weight-version counters, sampling batches from the ``ReplayBuffer`` (peer to peer),
publishing weights through :mod:`rlmesh.weights`, checkpoints (model, optimiser, RNG
states, step, version, whatever :meth:`Trainer.checkpoint_extra` adds and the frozen modules of
:meth:`Trainer.checkpointed_modules`) and one
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

A trainer mesh (``trainer.ranks=N``, docs/trainer.md): every rank builds the model, forms one process
group (:mod:`rlmesh.rl.train.distributed`), runs :meth:`setup` on its own full copy, takes rank 0's
weights and wraps the model with FSDP2 or DDP. Every rank gets the same ``train`` call; rank 0
alone samples from the buffer (one lease, settled once), splits the batch with :meth:`shard_batch`
and sends each rank its share; the gradients are reduced by FSDP or DDP; every rank publishes its
own part of the weights (``trainer.publish=sharded``; or rank 0 the gathered whole, ``gathered``)
and rank 0 answers with the step's result. Checkpoints are sharded
(:mod:`rlmesh.rl.train.dcp`). One rank forms no group and runs exactly the one-proc code.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import rlmesh as rm
from rlmesh.actor import kv
from rlmesh.rl import checkpoint
from rlmesh.rl.config import TrainerConfig
from rlmesh.rl.results import TrainerState, TrainResult
from rlmesh.rl.train import layout
from rlmesh.rl.train.clock import StepClock
from rlmesh.rl.train.recovery import group_epoch
from rlmesh.rl.train.sharding import merge_metrics, rank_weight
from rlmesh.weights import Publisher
from rlmesh.weights.sharded import ShardPublisher

if TYPE_CHECKING:
    from rlmesh.rl.train.distributed import TrainGroup

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
        self.group: TrainGroup | None = None
        """The trainer mesh's process group (``trainer.ranks`` > 1); ``None`` on one rank."""
        self.shards: ShardPublisher | None = None
        """This rank's publisher of its part of each version (``trainer.publish=sharded`` on a mesh)."""
        self.rank_weight = 1.0
        """This rank's share of the step, times the rank count (``world * units / total units``, see
        :meth:`units_in`): what a mesh rank's loss is scaled by so that the gradient FSDP or DDP averages
        is the whole batch's. 1.0 on one rank."""
        self.clock = StepClock()
        """This rank's step split into parts and its memory: a ``train_ranks`` row per step."""
        self.model = self.build_model()
        if getattr(config, "ranks", 1) > 1:
            self._init_mesh()
            return
        self.publisher = Publisher(weights)
        self.publisher.reserve(self.published_state())  # shm slots reserved while the optimiser and setup build
        self.optimizer = self.build_optimizer()
        self.clock.attach(self.model, self.optimizer)
        newest = self.newest_checkpoint()
        if newest is None:
            self.setup()
            self.publish()
        else:
            self.load_checkpoint(newest)

    def _init_mesh(self) -> None:
        """``__init__`` of one rank of a trainer mesh: the group, the same starting weights on every
        rank, the model wrapped, then version 0 published or the newest checkpoint loaded."""
        ranks = self.config.ranks
        ctx = rm.context()
        if len(ctx.coords) != 1 or math.prod(ctx.shape.values()) != ranks:
            raise rm.ConfigError(f"trainer.ranks={ranks} but this trainer was spawned on a mesh of shape {ctx.shape}: "
                                 "spawn it on trainer_procs(procs, first, trainer.ranks) (rlmesh.rl.run.placement)")
        cls = type(self)
        if cls.shard_batch is Trainer.shard_batch or cls.train is not Trainer.train:
            raise rm.ConfigError(f"trainer.ranks={ranks}: {cls.__name__} cannot train on a trainer mesh (it does not "
                                 "split its batch with shard_batch, or overrides train); use trainer.ranks=1")
        from rlmesh.rl.train.distributed import TrainGroup  # deferred: FSDP's import costs ~2 s; one rank skips it

        self.group = group = TrainGroup.form(f"{ctx.mesh_name}/{self.weights}", ctx.rank, ranks,
                                             self.config.group_timeout_s, epoch=group_epoch())
        if self.config.publish == "sharded":  # every rank publishes its part, under this incarnation's set
            self.publisher = None  # type: ignore[assignment]  # the ranks publish through self.shards
            self.shards = ShardPublisher(self.weights, group.rank, ranks, group.incarnation)
        else:
            self.publisher = Publisher(self.weights) if group.rank == 0 else None  # type: ignore[assignment]  # None on ranks that do not publish
        if self.publisher is not None:
            self.publisher.reserve(self.published_state())
        self.optimizer = self.build_optimizer()
        newest = self.newest_checkpoint()
        if newest is None:
            self.setup()  # on every rank's full copy, before sharding: a warm start needs no collectives
        group.broadcast_module(self.model)  # whatever setup did, every rank starts from rank 0's weights
        self.on_group(group)
        self.model = group.wrap(self.model, self.config.parallel)
        if self.shards is not None:
            from rlmesh.rl.train.publishing import local_pieces  # deferred: it imports DTensor; one rank skips it

            keys = self._published_keys()
            self.shards.reserve({k: p for k, p in local_pieces(self.model, group.rank, group.world).items() if k in keys})
        self.optimizer = self.build_optimizer()  # over the sharded parameters
        self.clock.attach(self.model, self.optimizer)
        if newest is None:
            self.publish()
        else:
            self.load_checkpoint(newest)

    # -- hooks -------------------------------------------------------------------------------------------------

    def build_model(self) -> torch.nn.Module:
        """Hook: the policy network (runs once, in ``__init__``, before the optimiser)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_model()")

    def published_state(self) -> dict[str, Any]:
        """Hook: the tensors a weight version carries to the generators (one rank). Default: the whole
        ``state_dict``; a LoRA trainer sends its adapters only."""
        return self.model.state_dict()

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
        """Hook: restore what :meth:`checkpoint_extra` saved. On a resumed trainer it also builds the
        modules of :meth:`checkpointed_modules` that :meth:`setup` would have built: their weights are
        loaded into them right after it."""

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        """Hook: the frozen modules this rank holds beside the policy, by name (GRPO's KL reference copy:
        no gradients, no optimizer state, sharded like the policy on a mesh). Their parameter bytes
        (this rank's shards) are ``train_ranks.ref_bytes``. Default: none."""
        return {}

    def checkpointed_modules(self) -> dict[str, torch.nn.Module]:
        """Hook: which of :meth:`frozen_modules` a checkpoint holds. In a sharded checkpoint each rank
        writes its shard of them through DCP beside the policy's (nothing is gathered); in a one-rank
        file they are whole. On load they are filled in place after :meth:`restore_extra`, at any rank
        count. Leave out a module that can be rebuilt from where it came from (a reference that is the
        model folder as loaded). Default: all of :meth:`frozen_modules`."""
        return self.frozen_modules()

    def shard_batch(self, batch: list[Any], world: int) -> list[list[Any]]:
        """Hook (trainer mesh, ``trainer.ranks`` > 1): split a sampled batch into ``world`` batches, one
        per rank, on rank 0. Every rank's :meth:`train_step` must then run the same number of forward
        and backward passes (FSDP's collectives pair them up). Not implemented here: a trainer that
        cannot guarantee that (PPO's early stop on KL) trains on one rank."""
        raise NotImplementedError(f"{type(self).__name__} does not split its batch across ranks")

    def units_in(self, batch: list[Any]) -> float:
        """Hook (trainer mesh): what this rank's loss on ``batch`` averages over (tokens, sequences);
        sets :attr:`rank_weight` each step. Default: :meth:`samples_in`."""
        return float(self.samples_in(batch))

    summed_metrics: frozenset[str] = frozenset()
    """Metrics that are counts, summed over the ranks of a trainer mesh (the others are averaged)."""

    def on_group(self, group: TrainGroup) -> None:
        """Hook (trainer mesh): runs once on every rank after the process group formed and before the
        model is wrapped (wrap a loss so the per-rank losses add up to the one-rank loss)."""

    # -- endpoints ---------------------------------------------------------------------------------------------

    @rm.endpoint
    def train(self, batch_size: int, timeout: float = 60.0) -> TrainResult:
        """Sample ``batch_size`` fresh rollouts from the buffer, run :meth:`train_step`, publish.

        Returns ``trained=False`` (with the drops) when the buffer had not enough fresh
        rollouts within ``timeout``; the controller then issues more work and calls again.
        """
        if self.buffer is None:
            raise RuntimeError(f"{type(self).__name__} was built without a buffer; call train_step() directly")
        self.clock.reset()
        if self.group is not None:
            return self._train_mesh(batch_size, timeout)
        with self.clock.section("sample_s"):
            res = self.buffer.sample.call_one(batch_size, self.version, timeout, self.cursor,
                                              self.durable_cursor).get()
        if not res.rollouts:
            out = TrainResult(self.step, self.version, self.samples_seen)
        else:
            out = self.learn([r.data for r in res.rollouts], max_lag=res.max_lag or 0, cursor=res.lease)
            out.rollout_ids = [r.rollout_id for r in res.rollouts]
        out.dropped, out.drop_reasons = [d.rollout_id for d in res.dropped], [d.reason for d in res.dropped]
        out.requeued = list(res.requeued)
        return out

    def _train_mesh(self, batch_size: int, timeout: float) -> TrainResult:
        """``train`` on a trainer mesh: rank 0 samples and sends each rank its share; all train."""
        group = self.group
        assert group is not None
        res, parts, failed = None, None, None
        if group.rank == 0:
            try:
                with self.clock.section("sample_s"):
                    res = self.buffer.sample.call_one(batch_size, self.version, timeout, self.cursor,
                                                      self.durable_cursor).get()
                batch = [r.data for r in res.rollouts]
                shards = self.shard_batch(batch, group.world) if batch else [None] * group.world
                head = (self.samples_in(batch) if batch else 0, res.max_lag or 0, res.lease)
                parts = [(shard, head) for shard in shards]
            except Exception as exc:  # the buffer died under us: the other ranks must not wait for a batch
                failed, parts = exc, [(None, (0, 0, None))] * group.world
        with self.clock.section("handoff_s"):
            shard, (samples, max_lag, lease) = group.scatter(parts)
        if failed is not None:
            raise failed
        if shard is None:
            out = TrainResult(self.step, self.version, self.samples_seen)
        else:
            out = self.learn(shard, max_lag=max_lag, cursor=lease, samples=samples)
        if res is not None:
            out.rollout_ids = [r.rollout_id for r in res.rollouts] if res.rollouts else []
            out.dropped, out.drop_reasons = [d.rollout_id for d in res.dropped], [d.reason for d in res.dropped]
            out.requeued = list(res.requeued)
        return out

    def learn(self, batch: list[Any], max_lag: int = 0, cursor: int | None = None,
              samples: int | None = None, deferred: bool = False) -> TrainResult:
        """:meth:`train_step` plus the bookkeeping: counters, buffer cursor, publish, checkpoint, telemetry.

        On a trainer mesh ``batch`` is this rank's share and ``samples`` the whole batch's count.
        ``deferred=True`` neither publishes nor checkpoints: the caller does both once after a run of
        steps (a trainer that collects its own rollouts, per call rather than per step)."""
        t0 = time.perf_counter()
        samples = self.samples_in(batch) if samples is None else samples
        clock = self.clock
        if self.group is not None:
            units = self.units_in(batch) if batch else 0.0
            with clock.section("sync_s"):
                self.rank_weight = rank_weight(units, self.group.all_sum([units])[0], self.group.world)
        clock.attach(self.model, self.optimizer)
        t_step = time.perf_counter()
        metrics = self.train_step(batch) if batch else {}
        t_step = time.perf_counter() - t_step
        if self.group is not None:  # one set of numbers for the step: rank 0 answers with it
            with clock.section("sync_s"):
                metrics = merge_metrics(self.group.gather({k: float(v) for k, v in metrics.items()}) or [metrics],
                                        self.summed_metrics)
        self.step += 1
        self.samples_seen += samples
        if cursor is not None:
            self.cursor = cursor
        if not deferred and self.step % self.config.publish_every == 0:
            with clock.section("publish_s"):
                self.publish()
        every = self.config.checkpoint_every
        if not deferred and self.config.checkpoint_dir and every and self.step % every == 0:
            with clock.section("checkpoint_s"):
                self.save_checkpoint()
        took = time.perf_counter() - t0
        lr = float(self.optimizer.param_groups[0]["lr"])
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["train/policy_lag"] = float(max_lag)
        # deferred: these weights are published later, under the step's number (or past the newest version)
        version = max(self.step, self.version) if deferred else self.version
        if self.group is None or self.group.rank == 0:
            rm.telemetry.record("train_steps", step=self.step, policy_version=version,
                                loss=metrics.get("losses/loss"), lr=lr, grad_norm=metrics.get("train/grad_norm"),
                                samples=samples, duration_s=took, metrics=json.dumps(metrics))
        waited = clock.times["sample_s"] + clock.times["handoff_s"]
        rm.telemetry.record("train_ranks", step=self.step, ranks=1 if self.group is None else self.group.world,
                            policy_version=version, step_s=took + waited,
                            **clock.row(t_step if batch else 0.0, self.model, self.optimizer,
                                        self.frozen_modules().values()))
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
        if self.group is not None:
            # A sharded save is a collective: the ranks stop one by one and a rank already gone
            # would hold the others for trainer.group_timeout_s. The run checkpoints every
            # trainer.checkpoint_every steps and the controller's final save runs on every rank.
            if self.publisher is not None:
                self.publisher.close()
            if self.shards is not None:
                self.shards.close()
            self.group.close()
            return
        if self.config.checkpoint_dir:
            self.save_checkpoint()
        self.publisher.close()

    # -- weights and checkpoints -------------------------------------------------------------------------------

    def publish(self) -> None:
        """Publish ``self.model``'s weights as version ``self.step``, or one past the newest version
        this job ever published under the name (a checkpoint rolled the trainer back, or a
        restarted proc resumed from one): versions never repeat and never go down."""
        if self.shards is not None:
            self._publish_shards()
            return
        if self.group is not None:
            state = self.group.full_state_dict(self.model)  # every rank: FSDP gathers the shards to rank 0
            version = 0
            if self.publisher is not None:
                keys = self._published_keys()
                state = {k: v for k, v in (state or {}).items() if k in keys}
                newest = self._newest_published()
                version = self.step if newest is None or self.step > newest else newest + 1
                kv.put(self._version_key(), version)
                assert state is not None
                self.clock.publish_bytes += self.publisher.publish(state, version=version).bytes
            self.version = self.group.broadcast_int(version)
            return
        newest = self._newest_published()
        self.version = self.step if newest is None or self.step > newest else newest + 1
        kv.put(self._version_key(), self.version)  # first: a kill mid-publish must not let a version number repeat
        self.clock.publish_bytes += self.publisher.publish(self.published_state(), version=self.version).bytes

    def _publish_shards(self) -> None:
        """``trainer.publish=sharded``: rank 0 reserves the version in the KV and tells every rank, then
        each publishes its own part under it (no gather). A generator reads the version once every
        rank has published it (:mod:`rlmesh.weights.shard_reader`), so a rank killed mid-publish
        leaves the previous version whole."""
        from rlmesh.rl.train.publishing import local_pieces  # deferred: it imports DTensor; one rank skips it

        group, shards = self.group, self.shards
        assert group is not None and shards is not None
        version = 0
        if group.rank == 0:
            newest = self._newest_published()
            version = self.step if newest is None or self.step > newest else newest + 1
            kv.put(self._version_key(), version)  # first: a kill mid-publish must not let a version number repeat
        self.version = version = group.broadcast_int(version)
        keys = self._published_keys()
        pieces = {k: p for k, p in local_pieces(self.model, group.rank, group.world).items() if k in keys}
        self.clock.publish_bytes += shards.publish(pieces, version).bytes

    def _published_keys(self) -> set[str]:
        """On a trainer mesh: the names, in the unwrapped module's state dict, of what :meth:`published_state`
        selects (the whole model, or a LoRA trainer's adapters); read from the keys alone, no collective."""
        from rlmesh.rl.train.distributed import unwrap  # deferred: FSDP's import costs ~2 s; one rank skips it

        wrapped = unwrap(self.model) is not self.model  # DDP's state dict names start with "module."
        return {k.removeprefix("module.") if wrapped else k for k in self.published_state()}

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
        sharded = self.group is not None or getattr(self.config, "checkpoint_format", "auto") == "dcp"
        if path is None:
            if not self.config.checkpoint_dir:
                raise rm.ConfigError("trainer.checkpoint_dir is not set; set it to save checkpoints")
            name = layout.name_for(self.step) if sharded else checkpoint.name_for(self.step)
            path = Path(self.config.checkpoint_dir) / name
        path = Path(path)
        t0 = time.perf_counter()
        frozen = self.checkpointed_modules()
        plain = {"step": self.step, "version": self.version, "samples_seen": self.samples_seen,
                 "buffer_cursor": self.cursor, "rng": checkpoint.rng_state(), "extra": self.checkpoint_extra(),
                 "frozen": sorted(frozen)}
        if sharded:
            from rlmesh.rl.train import dcp  # deferred: DCP's import costs ~2 s; one-rank file checkpoints skip it

            dcp.save(path, self.model, self.optimizer, plain, self.step, self.version, self.group, frozen)
        else:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **plain,
                     "frozen_state": {name: m.state_dict() for name, m in frozen.items()}}
            checkpoint.write(path, state, self.step, self.version)
        self.durable_cursor = self.cursor
        if self.group is None or self.group.rank == 0:
            layout.prune(path.parent, getattr(self.config, "checkpoint_keep", 3))
        self._record_checkpoint("save", path, time.perf_counter() - t0)
        return path

    def _record_checkpoint(self, event: str, path: Path, took: float) -> None:
        if self.group is not None and self.group.rank != 0:
            return
        if path.is_dir():
            size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
        else:
            size = path.stat().st_size if path.exists() else None  # type: ignore[assignment]  # None: no file
        rm.telemetry.record("checkpoints", event=event, step=self.step, policy_version=self.version, path=str(path),
                            bytes=size, buffer_cursor=self.cursor, duration_s=took)

    def _load_frozen(self, path: Path, state: dict[str, Any]) -> None:
        """The checkpoint's frozen modules (:meth:`checkpointed_modules` when it was saved) into the ones
        this trainer holds now; one it no longer holds (``trainer.kl_coef=0`` now) is skipped."""
        held = self.frozen_modules()
        names = [n for n in state.get("frozen", []) if n in held]
        if not names:
            return
        if path.is_dir():
            from rlmesh.rl.train import dcp  # deferred: DCP's import costs ~2 s; one-rank file checkpoints skip it

            dcp.load_frozen(path, {n: held[n] for n in names})
            return
        for n in names:
            if self.group is not None:  # a one-rank file's whole module into this rank's shard
                self.group.load_full_state_dict(held[n], state["frozen_state"][n])
            else:
                held[n].load_state_dict(state["frozen_state"][n])

    def newest_checkpoint(self) -> Path | None:
        """The newest checkpoint in ``checkpoint_dir``: a ``step_*.pt`` with its checksum file or a sharded
        ``step_*.dcp`` directory (``None`` if none)."""
        return layout.newest(Path(self.config.checkpoint_dir) if self.config.checkpoint_dir else None)

    def load_checkpoint(self, path: str | os.PathLike[str] | None = None) -> bool:
        """Restore from ``path``, or the newest ``step_*.pt`` in ``checkpoint_dir``; republish.
        Returns ``False`` when there is nothing to load; raises :class:`~rlmesh.rl.checkpoint.CheckpointError`
        for a file that fails its checksum or holds more than tensors and plain values."""
        t0 = time.perf_counter()
        path = Path(path) if path is not None else self.newest_checkpoint()
        if path is None:
            return False
        if path.is_dir():  # sharded: any rank count wrote it, DCP reshards to this one
            from rlmesh.rl.train import dcp  # deferred: DCP's import costs ~2 s; one-rank file checkpoints skip it

            state = dcp.load(path, self.model, self.optimizer)
        else:
            state = checkpoint.read(path)
            if self.group is None:
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
            else:  # a one-rank file into a sharded model
                from rlmesh.rl.train import dcp  # deferred: DCP's import costs ~2 s; one-rank file checkpoints skip it

                dcp.load_file_into(state, self.model, self.optimizer)
        self.step, self.samples_seen = int(state["step"]), int(state["samples_seen"])
        self.cursor = self.durable_cursor = int(state.get("buffer_cursor", 0))
        checkpoint.set_rng_state(state["rng"])
        self.restore_extra(state.get("extra", {}))
        self._load_frozen(path, state)
        self.publish()
        took = time.perf_counter() - t0
        logger.info("loaded checkpoint %s (step %d, buffer cursor %d) in %.3f s", path, self.step, self.cursor, took)
        self._record_checkpoint("load", path, took)
        return True
