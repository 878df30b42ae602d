"""The controller's side of the runtime's KV table: workers' ``KV_REQ`` messages, and held gets.

Why here and not in the controller: the table is a small service of its own (put, delete,
keys, and a get that waits for its key), and it runs on the supervisor thread only because
that thread owns the control socket. The controller hands each request in and calls
:meth:`KVService.expire` on its ticks; replies go out through its ``reply`` function.

A get for a key that is not there is held until a put of that key (by a worker or by the
controller itself, which :meth:`expire` notices) or until its timeout, then answered
``ok=False``; the answer to a proc that is gone goes nowhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from rlmesh.actor.kv import LocalKV


@dataclass(frozen=True)
class _HeldGet:
    deadline: float | None  # monotonic; None: forever
    ident: bytes  # the asking proc's control identity
    req: int
    key: str


class KVService:
    """Answers workers' KV requests from ``table``; ``reply(ident, req, ok, **fields)`` sends an answer
    (to a proc that is gone: nothing, and its held gets are dropped like any answered one)."""

    def __init__(self, table: LocalKV, reply: Callable[..., None]):
        self.table = table
        self._reply = reply
        self._held: list[_HeldGet] = []

    def __len__(self) -> int:
        """Gets held now (the controller calls :meth:`expire` only while there are some)."""
        return len(self._held)

    def handle(self, ident: bytes, msg: dict[str, Any]) -> None:
        op, key, req = msg["op"], msg["key"], msg["req"]
        if op == "put":
            self.table.put(key, msg["value"])
            self._reply(ident, req, True)
            self._wake(key)
        elif op == "delete":
            self.table.delete(key)
            self._reply(ident, req, True)
        elif op == "keys":
            self._reply(ident, req, True, value=self.table.keys(key))
        elif op == "get":
            try:
                self._reply(ident, req, True, value=self.table.get_nowait(key))
            except KeyError:
                t = msg.get("timeout")
                self._held.append(_HeldGet(None if t is None else time.monotonic() + t, ident, req, key))

    def _wake(self, key: str) -> None:
        keep = []
        for g in self._held:
            if g.key != key:
                keep.append(g)
            else:
                self._reply(g.ident, g.req, True, value=self.table.get_nowait(key))
        self._held = keep

    def expire(self, now: float) -> None:
        """Answer held gets whose key the controller itself put, and fail those past their deadline."""
        for key in {g.key for g in self._held}:
            try:
                self.table.get_nowait(key)
            except KeyError:
                continue
            self._wake(key)
        keep = []
        for g in self._held:
            if g.deadline is not None and g.deadline <= now:
                self._reply(g.ident, g.req, False, error=f"kv key {g.key!r} not present in time")
            else:
                keep.append(g)
        self._held = keep
