"""Call ids an actor server has taken, per caller: the runtime's own defence against a replayed call.

The transport already drops replayed messages (per-session counters); this is the
second wall, at the layer that runs user code: a call is named by its caller's inbox
address (unique per caller process incarnation) and its call id, and a name seen
before is never executed again. Memory is bounded with a sliding window per caller,
as IPsec's anti-replay window: the highest id seen, plus the ids taken within
``window`` below it. An id older than the window cannot be told apart from a replay,
so it is refused too (with an error reply, never run): a legitimate call gets there
only if ``window`` newer calls from the same caller overtook it.
"""

from __future__ import annotations

from enum import Enum

WINDOW = 1 << 14


class Verdict(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"  # served already: drop silently (the caller has its reply)
    TOO_OLD = "too old"  # below the window: refuse with an error, do not run


class CallIdWindow:
    """Pure bookkeeping, no I/O; used from the server's loop thread only."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self._callers: dict[str, tuple[int, set[int]]] = {}

    def admit(self, caller: str, call_id: int) -> Verdict:
        hi, seen = self._callers.get(caller, (0, None))
        if seen is None:
            seen = set()
        if call_id > hi:
            seen.add(call_id)
            if len(seen) > 2 * self.window:  # amortised O(1): prune once per `window` new ids
                floor = call_id - self.window
                seen = {i for i in seen if i > floor}
            self._callers[caller] = (call_id, seen)
            return Verdict.NEW
        if call_id <= hi - self.window:
            return Verdict.TOO_OLD
        if call_id in seen:
            return Verdict.DUPLICATE
        seen.add(call_id)
        self._callers[caller] = (hi, seen)
        return Verdict.NEW
