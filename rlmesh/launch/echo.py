"""Workers' output on the controller's terminal: prefixed by mesh and rank, repeated lines folded.

Eight ranks printing ``loading model`` at once show as one line::

    [procs[0-7] x8] loading model

How: a line is held for a short window (``RLMESH_LOG_FOLD_S``, default 0.3 s); the same
text from other ranks of the same mesh within that window joins it, and the group is
printed once, with the ranks and the count, in the order groups started. A window of 0
prints every line as it comes. stdout lines go to the controller's stdout, stderr lines
and logging records to its stderr. ``RLMESH_ECHO=0`` stops the echo (the ``logs``
table still gets every line).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from rlmesh import settings
from rlmesh.launch.output import ProcLine, OutputStream

FOLD_ENV = settings.LOG_FOLD_S.name
ECHO_ENV = settings.ECHO.name


def echo_enabled() -> bool:
    return settings.ECHO.get()


def fold_window() -> float:
    return settings.LOG_FOLD_S.get()


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


@dataclass
class _Group:
    first: float
    mesh: str
    stream: OutputStream
    text: str
    ranks: list[int] = field(default_factory=list)


class TerminalEcho:
    """Line sink that prints workers' output; :meth:`close` prints what is still held."""

    def __init__(self, window: float | None = None, out: TextIO | None = None, err: TextIO | None = None):
        self.window = fold_window() if window is None else window
        self._out, self._err = out, err
        self._groups: dict[tuple[str, OutputStream, str], _Group] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._holding = threading.Event()  # set while a line is held: an idle echo thread sleeps until then
        self._thread: threading.Thread | None = None
        if self.window > 0:
            self._thread = threading.Thread(target=self._loop, name="rlmesh-echo", daemon=True)
            self._thread.start()

    def __call__(self, lines: list[ProcLine]) -> None:
        if self.window <= 0:
            for line in lines:
                self._print(line.proc.proc_mesh, line.stream, line.render(), [line.proc.rank])
            return
        now = time.monotonic()
        groups = self._groups
        with self._lock:
            for line in lines:
                mesh, text = line.proc.proc_mesh, line.render()
                key = (mesh, line.stream, text)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = _Group(now, mesh, line.stream, text)
                g.ranks.append(line.proc.rank)
            self._holding.set()  # under the lock: the loop clears it under the lock when it finds none

    def _loop(self) -> None:
        """Print each group once its window is over; with nothing held, sleep until a line comes.

        Why not a fixed 0.1 s poll (as until Dec 2026): an idle run's controller woke this thread ten
        times a second for nothing, one of the wake-ups that add up to its idle CPU
        (docs/performance.md, "the controller at idle")."""
        while not self._stop.is_set():
            with self._lock:
                oldest = min((g.first for g in self._groups.values()), default=None)
                if oldest is None:
                    self._holding.clear()
            if oldest is None:
                self._holding.wait()  # a held line or close() sets it
                continue
            due = oldest + self.window - time.monotonic()
            if due > 0 and self._stop.wait(due):
                break
            self.flush(older_than=self.window)

    def flush(self, older_than: float = 0.0) -> None:
        """Print every group that started at least ``older_than`` seconds ago."""
        now = time.monotonic()
        with self._lock:
            ready = [k for k, g in self._groups.items() if now - g.first >= older_than]
            groups = [self._groups.pop(k) for k in ready]
        out: list[str] = []
        err: list[str] = []
        for g in sorted(groups, key=lambda g: g.first):  # one write per stream per tick, not one per line
            (out if g.stream == OutputStream.STDOUT else err).append(self._text(g.mesh, g.text, g.ranks))
        self._write(OutputStream.STDOUT, "".join(out))
        self._write(OutputStream.STDERR, "".join(err))

    @staticmethod
    def _text(mesh: str, text: str, ranks: list[int]) -> str:
        n = len(ranks)
        where = f"{mesh}[{rank_ranges(ranks)}]" + (f" x{n}" if n > 1 else "")
        return "".join(f"[{where}] {t}\n" for t in text.split("\n"))

    def _print(self, mesh: str, stream: OutputStream, text: str, ranks: list[int]) -> None:
        self._write(stream, self._text(mesh, text, ranks))

    def _write(self, stream: OutputStream, text: str) -> None:
        if not text:
            return
        target = (self._out or sys.stdout) if stream == OutputStream.STDOUT else (self._err or sys.stderr)
        try:
            target.write(text)
            target.flush()
        except (OSError, ValueError):  # a closed or broken terminal: the logs table still has it
            pass

    def close(self) -> None:
        self._stop.set()
        self._holding.set()
        if self._thread is not None:
            self._thread.join(1)
        self.flush()
