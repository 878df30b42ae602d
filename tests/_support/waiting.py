"""Polling until something is true, failing with what was awaited and for how long."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.05) -> T:
    """Call ``predicate`` every ``every`` seconds until it returns something truthy, and return that;
    after ``timeout`` seconds raise ``AssertionError`` naming ``what`` and the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
