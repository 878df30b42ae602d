"""Replay-buffer logic: rollouts tagged with a policy version, a staleness bound, and an
account of everything dropped.

Pure Python (no actor, no torch): the ``ReplayBuffer`` actor wraps this class, so what is
unit-tested here is what runs distributed. Invariants it keeps:

- **Staleness**: :meth:`ReplayBufferCore.sample` never returns a rollout generated more
  than ``max_policy_lag`` versions behind the trainer's current version (0 = strictly
  on-policy); stale ones are dropped and reported, never silently kept.
- **Nothing counted twice**: a rollout id is accepted once, ever. A duplicate (for
  example the same work re-issued after a generator restart, whose original also
  arrived) is dropped and reported; a sampled rollout is consumed.
- **Bounded**: beyond ``capacity`` the oldest rollouts are evicted (and reported).
- **Nothing lost to a trainer restart**: a batch sampled with ``lease=True`` stays on
  lease until the trainer says a checkpoint covers it (:meth:`ReplayBufferCore.settle`).
  A restarted trainer reports the cursor of its checkpoint, and every batch leased after
  it (sampled by the dead incarnation, trained or not, but lost with it) goes back to the
  front of the queue, oldest first, to be trained again or dropped as stale with a reason.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from rlmesh.rl.config import BufferConfig

logger = logging.getLogger(__name__)

FATES_KEPT = 65_536
"""Ids whose way out of the buffer (trained under a checkpoint, dropped) :meth:`ReplayBufferCore.fates`
remembers, newest first: a run's in-flight ids are far fewer."""


@dataclass(frozen=True)
class BufferedRollout:
    """A rollout as the buffer sees it: an id, the version that produced it, a size and the payload."""

    rollout_id: str
    policy_version: int
    data: Any = None
    num_samples: int = 1
    """Transitions or completions inside; used for sample accounting only."""


@dataclass(frozen=True)
class Dropped:
    """A rollout the buffer refused or discarded, and why."""

    rollout_id: str
    policy_version: int
    reason: str
    """``"stale"`` (lag above ``max_policy_lag``), ``"duplicate"`` or ``"capacity"``."""
    lag: int | None = None
    """Versions behind the trainer when it was dropped (stale only)."""


@dataclass
class SampleResult:
    """What :meth:`ReplayBufferCore.sample` returns: the batch and what it dropped on the way."""

    rollouts: list[BufferedRollout]
    dropped: list[Dropped] = field(default_factory=list)
    max_lag: int | None = None
    """Largest version lag inside the batch (None when empty): what the progress bar shows."""
    lease: int | None = None
    """Lease id of the batch (``sample(lease=True)`` with a non-empty batch): the trainer's buffer cursor."""
    requeued: list[str] = field(default_factory=list)
    """Ids put back by :meth:`ReplayBufferCore.settle` on this call (a restarted trainer's lost batches)."""


class ReplayBufferCore:
    """FIFO of rollouts with a staleness bound; see the module docstring for the invariants."""

    def __init__(self, config: BufferConfig | None = None) -> None:
        self.config = config or BufferConfig()
        self._queue: deque[BufferedRollout] = deque()
        self._seen: set[str] = set()
        self._dropped_total: Counter[str] = Counter()
        self._added = 0
        self._sampled = 0
        self._sampled_samples = 0
        self._leases: dict[int, list[BufferedRollout]] = {}
        self._next_lease = 1
        self._requeued = 0
        self._fates: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, rollout: BufferedRollout, current_version: int | None = None) -> list[Dropped]:
        """Store a rollout. Returns what was dropped by this call (the rollout itself if a
        duplicate, or already stale against ``current_version`` when given, or the oldest
        ones evicted for capacity)."""
        if rollout.rollout_id in self._seen:
            return self._record([Dropped(rollout.rollout_id, rollout.policy_version, "duplicate")])
        if current_version is not None and current_version - rollout.policy_version > self.config.max_policy_lag:
            self._seen.add(rollout.rollout_id)
            lag = current_version - rollout.policy_version
            return self._record([Dropped(rollout.rollout_id, rollout.policy_version, "stale", lag)])
        self._seen.add(rollout.rollout_id)
        self._queue.append(rollout)
        self._added += 1
        evicted = []
        while len(self._queue) > self.config.capacity:
            old = self._queue.popleft()
            evicted.append(Dropped(old.rollout_id, old.policy_version, "capacity"))
        return self._record(evicted)

    def drop_stale(self, current_version: int) -> list[Dropped]:
        """Discard every rollout more than ``max_policy_lag`` versions behind ``current_version``."""
        kept: deque[BufferedRollout] = deque()
        dropped = []
        for r in self._queue:
            lag = current_version - r.policy_version
            if lag < 0:
                raise ValueError(
                    f"rollout {r.rollout_id!r} has policy_version {r.policy_version} ahead of the trainer's "
                    f"current_version {current_version}: pass the trainer's latest published version"
                )
            if lag > self.config.max_policy_lag:
                dropped.append(Dropped(r.rollout_id, r.policy_version, "stale", lag))
            else:
                kept.append(r)
        self._queue = kept
        return self._record(dropped)

    def num_ready(self, current_version: int) -> int:
        """Rollouts that :meth:`sample` could return now (fresh enough), without dropping anything."""
        return sum(current_version - r.policy_version <= self.config.max_policy_lag for r in self._queue)

    def settle(self, cursor: int, durable: int) -> list[BufferedRollout]:
        """The trainer's word on its leases: it has trained every batch up to lease ``cursor``,
        and its newest checkpoint covers every batch up to lease ``durable`` (<= ``cursor``).

        Leases up to ``durable`` are forgotten (safe in a checkpoint). Leases after ``cursor``
        were taken by a trainer incarnation that died with them: they go back to the front of
        the queue, oldest first, and are returned. A live trainer calls this with its own
        cursor, which requeues nothing; a restarted one with its checkpoint's, which requeues
        what the dead incarnation sampled after that checkpoint.
        """
        if durable > cursor:
            raise ValueError(f"settle: durable lease {durable} is after the trained cursor {cursor}")
        self._next_lease = max(self._next_lease, cursor + 1)  # a resumed trainer's cursor came from another buffer
        for lid in [lid for lid in self._leases if lid <= durable]:
            for r in self._leases.pop(lid):
                self._left(r.rollout_id, "trained")
        orphans = [r for lid in sorted(self._leases) if lid > cursor for r in self._leases.pop(lid)]
        self._queue.extendleft(reversed(orphans))
        self._requeued += len(orphans)
        if orphans:
            logger.info("requeued %d rollouts leased after cursor %d (a restarted trainer lost them)", len(orphans),
                        cursor)
        return orphans

    def sample(self, batch_size: int, current_version: int, partial: bool = False, lease: bool = False) -> SampleResult:
        """Consume up to ``batch_size`` of the oldest fresh rollouts.

        Stale rollouts are dropped first (and reported in ``dropped``). If fewer than
        ``batch_size`` remain, nothing is consumed and ``rollouts`` is empty, unless
        ``partial=True``, which returns what there is. ``lease=True`` keeps the batch on a
        lease (``result.lease``) until :meth:`settle` says a checkpoint covers it.
        """
        if batch_size < 1:
            raise ValueError(f"sample: batch_size must be >= 1, got {batch_size}")
        dropped = self.drop_stale(current_version)
        if len(self._queue) < batch_size and not partial:
            return SampleResult([], dropped)
        batch = [self._queue.popleft() for _ in range(min(batch_size, len(self._queue)))]
        self._sampled += len(batch)
        self._sampled_samples += sum(r.num_samples for r in batch)
        max_lag = max((current_version - r.policy_version for r in batch), default=None)
        lease_id = None
        if lease and batch:
            lease_id = self._next_lease
            self._next_lease += 1
            self._leases[lease_id] = batch
        return SampleResult(batch, dropped, max_lag, lease_id)

    def fates(self, rollout_ids: list[str]) -> dict[str, str]:
        """Where each id is: ``held`` (queued or on lease), ``trained`` (on a lease a checkpoint covers),
        ``dropped:<reason>``, or ``unknown``. A controller whose trainer died between sampling and
        answering asks this: the answer that carried those drops and that step was lost."""
        held = set(self.holding())
        return {i: "held" if i in held else self._fates.get(i, "unknown") for i in rollout_ids}

    def _left(self, rollout_id: str, fate: str) -> None:
        self._fates[rollout_id] = fate
        self._fates.move_to_end(rollout_id)
        while len(self._fates) > FATES_KEPT:
            self._fates.popitem(last=False)

    def holding(self) -> list[str]:
        """Ids held now: queued or on lease."""
        return [r.rollout_id for r in self._queue] + [r.rollout_id for b in self._leases.values() for r in b]

    def stats(self) -> dict[str, float]:
        """Counters since creation, namespaced for telemetry (``buffer/...``)."""
        out = {
            "buffer/size": float(len(self._queue)),
            "buffer/added": float(self._added),
            "buffer/sampled": float(self._sampled),
            "buffer/sampled_samples": float(self._sampled_samples),
            "buffer/leased": float(sum(len(b) for b in self._leases.values())),
            "buffer/requeued": float(self._requeued),
        }
        for reason in ("stale", "duplicate", "capacity"):
            out[f"buffer/dropped_{reason}"] = float(self._dropped_total[reason])
        return out

    def _record(self, dropped: list[Dropped]) -> list[Dropped]:
        for d in dropped:
            self._dropped_total[d.reason] += 1
            if d.reason != "duplicate":  # a duplicate's original holds the id
                self._left(d.rollout_id, f"dropped:{d.reason}")
            logger.debug("dropped rollout %s (version %d): %s", d.rollout_id, d.policy_version, d.reason)
        return dropped
