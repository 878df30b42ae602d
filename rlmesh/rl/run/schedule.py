"""Work items for generators: unique ids, the weight version each must start from, and
how many may be in flight, so that generation overlaps training by at most
``max_policy_lag`` versions.

Pure bookkeeping (no actors), used by the recipes' controller loops and unit-tested.

The rule: a train step consumes ``per_step`` rollouts. With ``max_policy_lag = L`` at
most ``per_step * (L + 1)`` work items are outstanding (issued and not yet consumed or
dropped). Each item asks for weights at least as new as the trainer's newest published
version when it is issued. With ``L = 0`` generators therefore wait for the trainer
(strictly on-policy, nothing wasted); with ``L = 1`` the next batch is generated while the
current one trains. An item the buffer drops (stale, duplicate) frees its credit, so a
slow generator never deadlocks the loop. An item whose generator died is re-issued
with the *same* id: if the original still lands, the buffer rejects it as a duplicate.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class WorkItem:
    """One unit of generation: a rollout (gym) or a batch of prompt groups (LLM)."""

    work_id: str
    """Unique per item; becomes the rollout id (or its prefix), so a re-issued item is a duplicate."""
    min_version: int
    """The generator pulls weights at least this new before it starts."""
    index: int
    """Sequence number (seeds per-item data such as the prompts of an LLM item)."""


class WorkScheduler:
    """Issues :class:`WorkItem` s within the staleness credit (see the module docstring).

    Credit is held per work id, so releasing is idempotent: a rollout a restarted trainer
    gets back from the buffer and trains again, or a stale drop reported twice, frees
    nothing twice. ``on_event(event, item_or_id, reason)`` sees every transition
    (``issued``, ``reissued``, ``completed``, ``dropped``, ``consumed``); the recipes
    turn them into ``work_items`` telemetry rows, the account of every issued id.
    """

    def __init__(self, per_step: int, max_policy_lag: int, prefix: str = "w",
                 on_event: Callable[[str, str, str], None] | None = None) -> None:
        if per_step < 1:
            raise ValueError(f"WorkScheduler: per_step must be >= 1, got {per_step}")
        if max_policy_lag < 0:
            raise ValueError(f"WorkScheduler: max_policy_lag must be >= 0, got {max_policy_lag}")
        self.per_step, self.max_policy_lag, self.prefix = per_step, max_policy_lag, prefix
        self.on_event = on_event
        self.version = 0
        """Newest version the trainer is known to have published."""
        self._held: set[str] = set()
        self._landed: set[str] = set()  # held and delivered to the buffer: what a dead buffer takes with it
        self._next = 0
        self._retry: deque[WorkItem] = deque()
        self.issued = 0
        self.reissued = 0
        self.completed = 0
        self.dropped = 0

    @property
    def outstanding(self) -> int:
        """Items holding credit: issued, not yet consumed by a train step or dropped."""
        return len(self._held)

    @property
    def capacity(self) -> int:
        """Items allowed in flight: ``per_step * (max_policy_lag + 1)``."""
        return self.per_step * (self.max_policy_lag + 1)

    def can_issue(self) -> bool:
        return bool(self._retry) or self.outstanding < self.capacity

    def issue(self) -> WorkItem | None:
        """The next item to hand to a generator, or ``None`` when the credit is used up.

        Re-issued items come first and keep their id (they already hold a credit).
        """
        if self._retry:
            item = self._retry.popleft()
            return WorkItem(item.work_id, max(item.min_version, self.version), item.index)
        if self.outstanding >= self.capacity:
            return None
        item = WorkItem(f"{self.prefix}{self._next:07d}", self.version, self._next)
        self._next += 1
        self._held.add(item.work_id)
        self.issued += 1
        self._event("issued", item.work_id, "")
        return item

    def reissue(self, item: WorkItem, reason: str = "") -> None:
        """The generator running ``item`` died or timed out: run it again elsewhere, same id, no new credit."""
        self._retry.append(item)
        self.reissued += 1
        self._event("reissued", item.work_id, reason)

    def completed_item(self, work_id: str) -> None:
        """A generator delivered ``work_id`` and the buffer accepted it."""
        self.completed += 1
        if work_id in self._held:
            self._landed.add(work_id)
        self._event("completed", work_id, "")

    def lost_with_buffer(self, reason: str, kept: Iterable[str] = ()) -> list[str]:
        """The buffer's proc died: every item it held (delivered, not yet consumed) is dropped with
        ``reason`` and its credit freed, so fresh work replaces it; ``kept``: ids the replacement
        buffer already holds (delivered to it since). Returns the dropped ids."""
        gone = sorted(self._landed - set(kept))
        self.rejected(gone, [reason] * len(gone))
        return gone

    def landed(self) -> list[str]:
        """Ids delivered to the buffer and not yet consumed or dropped."""
        return sorted(self._landed)

    def rejected(self, work_ids: Iterable[str], reasons: Iterable[str] | None = None) -> None:
        """These items were dropped (by the buffer: stale, capacity): their credit is free again."""
        ids = list(work_ids)
        why = list(reasons) if reasons is not None else ["dropped"] * len(ids)
        for wid, reason in zip(ids, why):
            if wid in self._held:
                self.dropped += 1
                self._event("dropped", wid, reason)
        self._release(ids)

    def consumed(self, work_ids: Iterable[str], version: int) -> None:
        """A train step consumed these items and published ``version``."""
        ids = list(work_ids)
        for wid in ids:
            if wid in self._held:
                self._event("consumed", wid, "")
        self._release(ids)
        self.version = max(self.version, version)

    def requeued(self, work_ids: Iterable[str]) -> None:
        """The buffer gave these back to a restarted trainer (sampled by its dead incarnation after
        its checkpoint): they will be trained again or dropped; credit is unchanged."""
        for wid in work_ids:
            self._event("requeued", wid, "sampled by a trainer that died; its checkpoint predates them")

    def in_flight(self) -> list[str]:
        """Ids still holding credit (at the end of a run: generated or running, never trained on)."""
        return sorted(self._held)

    def _release(self, work_ids: list[str]) -> None:
        self._held.difference_update(work_ids)
        self._landed.difference_update(work_ids)

    def _event(self, event: str, work_id: str, reason: str) -> None:
        if self.on_event is not None:
            self.on_event(event, work_id, reason)


class AsyncWorkScheduler(WorkScheduler):
    """:class:`WorkScheduler` for asyncio controller loops: :meth:`next_item` waits for credit.

    One instance per controller loop (event loop); generator loops ``await next_item()``,
    the training loop calls :meth:`consumed` / :meth:`rejected`, which wake them.
    """

    def __init__(self, per_step: int, max_policy_lag: int, prefix: str = "w",
                 on_event: Callable[[str, str, str], None] | None = None) -> None:
        super().__init__(per_step, max_policy_lag, prefix, on_event)
        self._asyncio = asyncio
        self._credit: Any = None

    def _wake(self) -> Any:
        if self._credit is None:
            self._credit = self._asyncio.Event()
        return self._credit

    async def next_item(self) -> WorkItem:
        """The next work item, waiting while all credit is in flight."""
        while True:
            item = self.issue()
            if item is not None:
                return item
            ev = self._wake()
            ev.clear()
            await ev.wait()

    def finished(self, result: dict[str, Any]) -> None:
        """A generator returned ``result`` for an item: accepted, or refused as stale (its credit
        is free); a refused duplicate is re-issued work whose original landed and holds the credit."""
        if result["accepted"]:
            self.completed_item(result["rollout_id"])
        elif result.get("reason") != "duplicate":
            self.rejected([result["rollout_id"]], [result.get("reason") or "refused"])
        else:
            self._event("duplicate", result["rollout_id"], "the original landed first")

    def reissue(self, item: WorkItem, reason: str = "") -> None:
        super().reissue(item, reason)
        self._wake().set()

    def _release(self, work_ids: list[str]) -> None:
        super()._release(work_ids)
        if work_ids:
            self._wake().set()
