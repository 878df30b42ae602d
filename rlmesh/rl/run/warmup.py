"""Warm-up phases (GRPO's SFT warm start, a generator's engine start): reported by actors, shown by the controller.

These phases run inside actors' ``__init__``, in other procs, while the controller is
blocked in ``spawn``. An actor reports one with :class:`WarmupPhase`, which records
``phases`` rows (started, about every second while running, done or failed); the
controller's :class:`WarmupDisplay` reads them back with SQL while it waits and shows each
phase as its own progress: a bar with ETA when the phase has a total, a spinner otherwise.
Rows, not calls, because the controller cannot call an actor that is still in
``__init__``, and because the rows stay: ``SELECT phase, max(elapsed_s) FROM phases GROUP BY 1``
says after the run how long each warm-up took.
"""

from __future__ import annotations

import enum
import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

import rlmesh as rm
from rlmesh import settings
from rlmesh.rl.run.report import _hms, progress_format

TABLE = "phases"


class PhaseState(enum.StrEnum):
    STARTED = "started"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class WarmupPhase:
    """Actor side: ``with WarmupPhase("SFT warm start", total=500) as phase: ... phase.update(i + 1)``.

    Records a ``phases`` row on entry, at most one a second from :meth:`update`, and one on
    exit (``done``, or ``failed`` when the block raised). Cheap enough to call every step.
    """

    EVERY_S = 1.0

    def __init__(self, phase: str, total: int | None = None, unit: str = "steps") -> None:
        self.phase, self.total, self.unit = phase, total, unit
        self.completed = 0
        self.start = self._last = 0.0

    def _record(self, state: PhaseState) -> None:
        self._last = time.perf_counter()
        rm.telemetry.record(TABLE, phase=self.phase, state=str(state), completed=self.completed, total=self.total,
                            unit=self.unit, elapsed_s=round(self._last - self.start, 3))

    def __enter__(self) -> "WarmupPhase":
        self.start = time.perf_counter()
        self._record(PhaseState.STARTED)
        return self

    def update(self, completed: int) -> None:
        self.completed = completed
        if time.perf_counter() - self._last >= self.EVERY_S:
            self._record(PhaseState.RUNNING)

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None and self.total is not None:
            self.completed = self.total
        self._record(PhaseState.DONE if exc_type is None else PhaseState.FAILED)


@dataclass(frozen=True)
class PhaseStatus:
    """One phase of one actor mesh, over its ranks (their latest rows)."""

    mesh: str
    phase: str
    ranks: int
    done: int  # ranks whose phase ended (done or failed)
    failed: int
    completed: int
    total: int | None  # None while any rank's total is unknown
    unit: str
    elapsed_s: float

    @property
    def key(self) -> str:
        return f"{self.mesh}: {self.phase}"

    @property
    def finished(self) -> bool:
        return self.done == self.ranks

    def snapshot(self) -> dict[str, Any]:
        return {"phase": self.key, "ranks": self.ranks, "ranks_done": self.done, "failed": self.failed,
                "completed": self.completed, "total": self.total, "unit": self.unit, "elapsed_s": self.elapsed_s}


def phase_status(query: Callable[[str], Any], since: float) -> list[PhaseStatus]:
    """The phases reported since ``since`` (epoch seconds), in the order they started."""
    sql = f"""
        WITH last AS (
          SELECT mesh, rank, phase, min(ts) AS first, arg_max(state, ts) AS state, arg_max(completed, ts) AS completed,
                 arg_max(total, ts) AS total, arg_max(unit, ts) AS unit, arg_max(elapsed_s, ts) AS elapsed_s
          FROM {TABLE} WHERE ts >= to_timestamp({since:.6f}) GROUP BY ALL)
        SELECT mesh, phase, count(*) AS ranks,
               count(*) FILTER (WHERE state IN ('done', 'failed')) AS done,
               count(*) FILTER (WHERE state = 'failed') AS failed,
               sum(completed)::BIGINT AS completed,
               CASE WHEN count(total) = count(*) THEN sum(total)::BIGINT END AS total,
               any_value(unit) AS unit, max(elapsed_s) AS elapsed_s
        FROM last GROUP BY ALL ORDER BY min(first), mesh, phase"""
    return [PhaseStatus(**row) for row in query(sql).to_pylist()]


class WarmupDisplay:
    """Controller side: ``with WarmupDisplay(rm.telemetry.query): roles = spawn(procs)``.

    Polls the ``phases`` table while the block runs. On a terminal: one rich bar per phase
    (ranks done, units, elapsed, ETA; a spinner without a total). Piped: a plain line per
    phase when it starts, every ``RLMESH_PROGRESS_EVERY_S`` seconds while it runs and when
    every rank is done (JSON lines with ``RLMESH_PROGRESS=json``). Queries that fail (telemetry
    off) show nothing.
    """

    SETTLE_S = 3.0

    def __init__(self, query: Callable[[str], Any], enabled: bool = True, stream: Any = None,
                 poll_s: float = 0.5) -> None:
        self.query, self.stream, self.poll_s = query, stream, poll_s
        self.format = progress_format(enabled, stream)
        self.every = settings.PROGRESS_EVERY_S.get()
        self._progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
            TextColumn("{task.fields[count]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            disable=self.format != "bar", transient=False)
        self._tasks: dict[str, Any] = {}
        self._said: dict[str, tuple[float, bool]] = {}  # phase -> (when last printed, finished then)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.since = 0.0
        self.seen: list[PhaseStatus] = []

    def __enter__(self) -> "WarmupDisplay":
        if self.format == "off":
            return self
        self.since = time.time()
        self._progress.start()
        self._thread = threading.Thread(target=self._loop, name="rlmesh-warmup-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(10)
        # The block is over, so every phase in it ended: wait (briefly) for the rows that say so,
        # which trail the actors by a flush interval or two, and show them before the bar goes.
        # Not when no phase was ever seen (a gym recipe's actors report none): that wait was
        # 0.3 s of every run's start-up.
        deadline = time.monotonic() + self.SETTLE_S
        before = None
        self.poll()
        while (exc[0] is None and self.seen and time.monotonic() < deadline
               and (before != self.seen or not _settled(self.seen))):
            before = self.seen
            time.sleep(0.3)
            self.poll()
        self._progress.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        try:
            status = phase_status(self.query, self.since)
        except Exception:  # noqa: BLE001 - telemetry off, or the table not there yet: nothing to show
            return
        self.seen = status
        for s in status:
            if self.format == "bar":
                self._bar(s)
            else:
                self._line(s)

    @staticmethod
    def _count(s: PhaseStatus) -> str:
        units = (f"{s.completed}/{s.total} {s.unit}" if s.total is not None
                 else f"{s.completed} {s.unit}" if s.completed else "")
        ranks = f"  ranks done {s.done}/{s.ranks}" if s.ranks > 1 else ""
        state = "  failed" if s.failed else ("  done" if s.finished else "")
        return (units + ranks + state).strip()

    def _bar(self, s: PhaseStatus) -> None:
        task = self._tasks.get(s.key)
        total = s.total if s.total is not None else (s.ranks if s.finished else None)
        completed = s.completed if s.total is not None else (s.ranks if s.finished else 0)
        if task is None:
            task = self._tasks[s.key] = self._progress.add_task(s.key, total=total, count=self._count(s))
        self._progress.update(task, total=total, completed=completed, count=self._count(s))

    def _line(self, s: PhaseStatus) -> None:
        now = time.monotonic()
        last, was_finished = self._said.get(s.key, (float("-inf"), False))
        if was_finished or not (s.finished or now - last >= self.every):
            return
        self._said[s.key] = (now, s.finished)
        if self.format == "json":
            text = json.dumps({"warmup": s.snapshot(), "final": s.finished})
        else:
            text = f"[{s.key}] {self._count(s)}  elapsed {_hms(s.elapsed_s)}"
        out = self.stream or sys.stdout
        out.write(text + "\n")
        out.flush()


def _settled(status: list[PhaseStatus]) -> bool:
    """Every phase finished, and within a mesh every phase has as many ranks as the others
    (the ranks of one mesh run the same ``__init__``: a rank missing from one phase has rows on the way)."""
    ranks: dict[str, set[int]] = {}
    for s in status:
        ranks.setdefault(s.mesh, set()).add(s.ranks)
    return all(s.finished for s in status) and all(len(r) == 1 for r in ranks.values())
