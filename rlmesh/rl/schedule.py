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

from collections import deque
from dataclasses import dataclass
from typing import Any


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
    """Issues :class:`WorkItem` s within the staleness credit (see the module docstring)."""

    def __init__(self, per_step: int, max_policy_lag: int, prefix: str = "w") -> None:
        if per_step < 1:
            raise ValueError(f"WorkScheduler: per_step must be >= 1, got {per_step}")
        if max_policy_lag < 0:
            raise ValueError(f"WorkScheduler: max_policy_lag must be >= 0, got {max_policy_lag}")
        self.per_step, self.max_policy_lag, self.prefix = per_step, max_policy_lag, prefix
        self.version = 0
        """Newest version the trainer is known to have published."""
        self.outstanding = 0
        self._next = 0
        self._retry: deque[WorkItem] = deque()
        self.issued = 0
        self.reissued = 0

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
        self.outstanding += 1
        self.issued += 1
        return item

    def reissue(self, item: WorkItem) -> None:
        """The generator running ``item`` died: run it again elsewhere, same id, no new credit."""
        self._retry.append(item)
        self.reissued += 1

    def rejected(self, n: int = 1) -> None:
        """``n`` items were dropped by the buffer (stale or duplicate): their credit is free again."""
        self._release(n)

    def consumed(self, n: int, version: int) -> None:
        """A train step consumed ``n`` items and published ``version``."""
        self._release(n)
        self.version = max(self.version, version)

    def _release(self, n: int) -> None:
        if n < 0 or n > self.outstanding:
            raise ValueError(f"WorkScheduler: cannot release {n} items, {self.outstanding} outstanding")
        self.outstanding -= n


class AsyncWorkScheduler(WorkScheduler):
    """:class:`WorkScheduler` for asyncio controller loops: :meth:`next_item` waits for credit.

    One instance per controller loop (event loop); generator loops ``await next_item()``,
    the training loop calls :meth:`consumed` / :meth:`rejected`, which wake them.
    """

    def __init__(self, per_step: int, max_policy_lag: int, prefix: str = "w") -> None:
        super().__init__(per_step, max_policy_lag, prefix)
        import asyncio

        self._asyncio = asyncio
        self._credit: Any = None

    def _event(self) -> Any:
        if self._credit is None:
            self._credit = self._asyncio.Event()
        return self._credit

    async def next_item(self) -> WorkItem:
        """The next work item, waiting while all credit is in flight."""
        while True:
            item = self.issue()
            if item is not None:
                return item
            ev = self._event()
            ev.clear()
            await ev.wait()

    def finished(self, result: dict[str, Any]) -> None:
        """A generator returned ``result`` for an item: free its credit if the buffer refused it as
        stale (a refused duplicate's credit is still held by the original that did land)."""
        if not result["accepted"] and result.get("reason") != "duplicate":
            self.rejected(1)

    def reissue(self, item: WorkItem) -> None:
        super().reissue(item)
        self._event().set()

    def _release(self, n: int) -> None:
        super()._release(n)
        if n:
            self._event().set()
