"""Actor classes for the supervision and chaos tests: constructions that take time, and a proc
that keeps writing so a test can see whether it outlived its controller."""

import os
import threading
import time
from pathlib import Path

import rlmesh as rm


class SlowInit(rm.Actor):
    """``__init__`` announces itself (a file named after its pid) and then takes ``delay`` seconds."""

    def __init__(self, marker_dir: str, delay: float):
        Path(marker_dir, f"init-{os.getpid()}").write_text("")
        time.sleep(delay)

    @rm.endpoint
    def pid(self) -> int:
        return os.getpid()

    @rm.endpoint
    def incarnation(self) -> int:
        return rm.context().proc.incarnation


class Scribbler(rm.Actor):
    """Appends a line to ``path`` every 50 ms from a thread, and a line at ``on_stop``: after its
    controller died, neither may happen any more."""

    def __init__(self, path: str):
        self.path = path
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            with open(self.path, "a") as f:
                f.write(f"{time.time()} tick {os.getpid()}\n")

    @rm.endpoint
    def pid(self) -> int:
        return os.getpid()

    def on_stop(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{time.time()} on_stop {os.getpid()}\n")


class Spinner(rm.Actor):
    @rm.endpoint
    def spin(self, s: float) -> int:
        """Busy Python for ``s`` seconds (holds the GIL in 5 ms slices, like real work)."""
        end = time.monotonic() + s
        n = 0
        while time.monotonic() < end:
            n += 1
        return n

    @rm.endpoint
    def pid(self) -> int:
        return os.getpid()


class Counter(rm.Actor):
    def __init__(self, start: int = 0):
        self.n = start

    @rm.endpoint
    def incr(self, k: int = 1) -> int:
        self.n += k
        return self.n


class StuckUntilKilled(rm.Actor):
    """``state`` on the proc's first incarnation announces itself (a file) and never returns: the
    call is in flight when the test kills the proc. On a replacement it returns the incarnation."""

    def __init__(self, marker_dir: str):
        self.marker_dir = marker_dir

    @rm.endpoint
    def state(self) -> int:
        incarnation = rm.context().proc.incarnation
        if incarnation == 0:
            Path(self.marker_dir, f"state-{os.getpid()}").write_text("")
            threading.Event().wait()
        return incarnation
