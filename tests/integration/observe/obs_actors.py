"""Actors of the observability scenario: they print, log, die by SIGKILL and hang holding the GIL."""

import logging
import os
import re
import signal
import sys

import rlmesh as rm

log = logging.getLogger("talker")


class Talker(rm.Actor):
    @rm.endpoint
    def say(self, msg: str) -> int:
        print(f"{msg}")
        print(f"{msg} (on stderr)", file=sys.stderr)
        log.warning("talker said %s", msg)
        return os.getpid()

    @rm.endpoint
    def fail_logged(self) -> None:
        try:
            {}["missing"]
        except KeyError:
            log.exception("lookup failed")

    @rm.endpoint
    def print_then_sigkill(self, n: int) -> None:
        """n numbered lines, then SIGKILL: nothing after the print can flush anything."""
        for i in range(n):
            print(f"line {i} of {n}")
        os.kill(os.getpid(), signal.SIGKILL)

    @rm.endpoint
    def stuck_in_regex(self) -> None:
        """Holds the GIL for hours: heartbeats stop, only a C-level stack dump can see it."""
        re.match(r"(a+)+$", "a" * 48 + "b")


class Pauser(rm.Actor):
    @rm.endpoint
    def compute(self, x: int) -> int:
        y = x + 1
        breakpoint()
        return y * 2

    @rm.endpoint
    def divide(self, x: int) -> float:
        z = x - x
        return x / z  # ZeroDivisionError: with RLMESH_POST_MORTEM=1 the actor pauses here

    @rm.endpoint
    def ping(self) -> int:
        return rm.context().rank


class WarmingUp(rm.Actor):
    """Runs a warm-up phase in __init__, like GRPO's SFT warm start: the controller is blocked in spawn meanwhile.

    Halfway it waits (still reporting) until ``seen_file`` exists, i.e. until the controller
    has shown the phase running: the test then does not depend on how fast rows travel.
    """

    def __init__(self, steps: int, step_s: float, seen_file: str):
        import time

        from rlmesh.rl.run.warmup import WarmupPhase

        with WarmupPhase("SFT warm start", total=steps) as phase:
            for i in range(steps):
                time.sleep(step_s)
                phase.update(i + 1)
                deadline = time.monotonic() + 60
                while i + 1 == steps // 2 and not os.path.exists(seen_file) and time.monotonic() < deadline:
                    time.sleep(0.1)
                    phase.update(i + 1)
        with WarmupPhase("engine start", unit="engines"):
            pass

    @rm.endpoint
    def ping(self) -> int:
        return rm.context().rank
