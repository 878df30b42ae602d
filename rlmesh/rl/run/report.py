"""What a recipe shows its user: a live progress bar while it runs, and at the end a
summary table plus example SQL queries for the run (all read back from telemetry,
so the summary shows what was recorded, not what the controller believes)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rlmesh import settings


PROGRESS_FORMAT_ENV = settings.PROGRESS.name  # auto (default) | bar | plain | json | off
PROGRESS_EVERY_ENV = settings.PROGRESS_EVERY_S.name  # seconds between plain/json lines (default 10)


def progress_format(enabled: bool = True, stream: Any = None) -> str:
    """``bar`` on a terminal, ``plain`` lines when piped (``tee``, an agent), ``json`` lines or ``off`` on request."""
    want = settings.PROGRESS.get()
    if not enabled or want == "off":
        return "off"
    if want in ("bar", "plain", "json"):
        return want
    return "bar" if (stream or sys.stdout).isatty() else "plain"


def eta_s(done: float, total: float, elapsed: float) -> float | None:
    """Seconds left at the average rate so far (None before any progress)."""
    if done <= 0 or elapsed <= 0 or total <= done:
        return None if done <= 0 else 0.0
    return elapsed * (total - done) / done


def _hms(s: float | None) -> str:
    if s is None or s != s:
        return "?"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class RunProgress:
    """Progress over train steps with the key numbers: step, reward, samples/s, policy lag, ETA.

    On a terminal: a rich bar; workers' output (echoed by the launcher through ``sys.stdout``)
    is printed above it, never through it. Piped: one plain line every
    ``RLMESH_PROGRESS_EVERY_S`` seconds (default 10) and at the end; ``RLMESH_PROGRESS=json``
    makes those lines JSON objects (for agents). ``enabled=False`` or ``RLMESH_PROGRESS=off``:
    silent (still tracks the numbers).
    """

    def __init__(self, total: int, unit: str = "steps", enabled: bool = True, phase: str = "train",
                 stream: Any = None) -> None:
        self.total, self.unit, self.phase = total, unit, phase
        self.stream = stream
        self.format = progress_format(enabled, stream)
        self.enabled = self.format != "off"
        self.start = time.perf_counter()
        self.completed = 0
        self._last_line = float("-inf")  # the first update prints a line at once
        self.every = settings.PROGRESS_EVERY_S.get()
        self.fields: dict[str, Any] = {"reward": float("nan"), "sps": 0.0, "lag": 0, "step": 0}
        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn(
            "{task.completed:>8.0f}/{task.total:.0f} " + unit + "  step {task.fields[step]}  reward "
            "{task.fields[reward]:.3f}  samples/s {task.fields[sps]:.0f}  lag {task.fields[lag]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), disable=self.format != "bar",
            transient=False)
        self._task = self._progress.add_task(phase, total=total, **self.fields)

    def __enter__(self) -> "RunProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()
        if self.format in ("plain", "json"):
            self._line(final=True)

    def update(self, completed: int, **fields: Any) -> None:
        self.fields.update({k: v for k, v in fields.items() if v is not None})
        self.completed = min(completed, self.total)
        self._progress.update(self._task, completed=self.completed, **self.fields)
        if self.format in ("plain", "json") and time.perf_counter() - self._last_line >= self.every:
            self._line()

    def snapshot(self) -> dict[str, Any]:
        """The numbers a line shows, as plain values."""
        elapsed = time.perf_counter() - self.start
        out = {"phase": self.phase, "completed": self.completed, "total": self.total, "unit": self.unit,
               "elapsed_s": round(elapsed, 1), "eta_s": None, **self.fields}
        eta = eta_s(self.completed, self.total, elapsed)
        out["eta_s"] = None if eta is None else round(eta, 1)
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in out.items()}

    def _line(self, final: bool = False) -> None:
        self._last_line = time.perf_counter()
        snap = self.snapshot()
        if self.format == "json":
            text = json.dumps({"progress": snap, "final": final})
        else:
            pct = 100.0 * snap["completed"] / snap["total"] if snap["total"] else 100.0
            reward = "?" if snap["reward"] is None else f"{snap['reward']:.3f}"
            text = (f"[{self.phase}] {snap['completed']}/{snap['total']} {self.unit} ({pct:.0f}%)  "
                    f"step {snap['step']}  reward {reward}  samples/s {snap['sps']:.0f}  lag {snap['lag']}  "
                    f"elapsed {_hms(snap['elapsed_s'])}  eta {_hms(snap['eta_s'])}" + ("  done" if final else ""))
        out = self.stream or sys.stdout
        out.write(text + "\n")
        out.flush()


def example_queries(run_id: str) -> list[tuple[str, str]]:
    """Three queries worth running on a finished recipe run, as ``(what, sql)``."""
    return [
        ("reward by policy version",
         "SELECT policy_version, count(*) AS rollouts, avg(reward) AS reward FROM rollouts "
         "GROUP BY 1 ORDER BY 1"),
        ("evaluation curve",
         "SELECT step, env_steps, metric, round(value, 3) AS value FROM evals ORDER BY step"),
        ("train step cost and weight-sync time per version",
         "SELECT t.step, round(t.duration_s, 4) AS train_s, round(avg(w.duration_s), 5) AS sync_s "
         "FROM train_steps t LEFT JOIN weight_syncs w ON w.version = t.policy_version "
         "GROUP BY 1, 2 ORDER BY 1 DESC LIMIT 10"),
    ]


def print_summary(run_id: str, rows: list[tuple[str, str]], console: Console | None = None) -> None:
    """The closing table (``rows`` of name, value) and the example queries for ``run_id``."""
    console = console or Console()
    table = Table(title=f"run {run_id}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    console.print("Query this run:")
    for what, sql in example_queries(run_id):
        console.print(f"  # {what}")
        console.print(f'  rlmesh sql {run_id} "{sql}"', soft_wrap=True, markup=False, highlight=False)


def telemetry_counts(query: Any, target: float | None = None) -> dict[str, Any]:
    """Counts the summary shows, read from the run's tables with ``query`` (``rm.telemetry.query``).

    ``last_eval`` is the evaluation of the newest version (not the last to arrive: evaluations run
    beside training and may finish out of order); ``first_reaching`` the first version whose
    evaluation reached ``target`` (``None`` when none did, or no target)."""
    one = lambda sql: query(sql).to_pylist()[0]  # noqa: E731
    out = one("SELECT count(*) AS rollouts, count(DISTINCT rollout_id) AS distinct_ids, "
              "coalesce(sum(samples), 0) AS samples FROM rollouts")
    out.update(one("SELECT count(*) AS train_steps, max(policy_version) AS last_version FROM train_steps"))
    out.update(one("SELECT count(*) AS weight_syncs, avg(duration_s) AS sync_s FROM weight_syncs"))
    last = query("SELECT metric, value, step, policy_version, env_steps FROM evals "
                 "ORDER BY policy_version DESC, ts DESC LIMIT 1").to_pylist()
    out["last_eval"] = last[0] if last else None
    first = query(f"SELECT metric, value, step, policy_version, env_steps FROM evals WHERE value >= {float(target)} "
                  "ORDER BY policy_version, ts LIMIT 1").to_pylist() if target is not None else []
    out["first_reaching"] = first[0] if first else None
    out.update(work_account(query))
    out.update(one("SELECT count(*) FILTER (WHERE event = 'died') AS proc_deaths, "
                   "count(*) FILTER (WHERE event = 'restarted') AS restarts, "
                   "count(*) FILTER (WHERE event = 'recovered') AS recoveries, "
                   "median(serving_s) FILTER (WHERE event = 'restarted') AS median_serving_s, "
                   "median(recovery_s) FILTER (WHERE event = 'recovered') AS median_recovery_s FROM actors"))
    out["proc_memory"] = query(PROC_MEMORY_SQL).to_pylist()
    return out


PROC_MEMORY_SQL = """
WITH p AS (SELECT proc, max(rss) AS peak_rss, count(warning) AS warnings FROM proc_health GROUP BY proc),
a AS (SELECT proc, arg_max(actors, ts) AS actors FROM actors WHERE actors IS NOT NULL GROUP BY proc)
SELECT p.proc, a.actors, p.peak_rss, p.warnings FROM p LEFT JOIN a USING (proc) ORDER BY p.peak_rss DESC, p.proc"""
"""Each proc's peak RSS and RSS growth warnings (``proc_health``), with the actors it hosted."""


def proc_memory_line(procs: list[dict[str, Any]], most: int = 6) -> str:
    """The summary's "peak RSS per proc" value, biggest first, each proc named by the actors it hosted:
    ``generator/0 0.70 GB, trainer/0 0.51 GB, controller 0.42 GB`` (``(growing)`` after a proc with a growth warning)."""
    if not procs:
        return "not sampled"
    parts = [f"{p.get('actors') or p['proc']} {p['peak_rss'] / 2**30:.2f} GB" + (" (growing)" if p.get("warnings") else "")
             for p in procs[:most]]
    more = len(procs) - most
    return ", ".join(parts) + (f", {more} more" if more > 0 else "")


TERMINAL_EVENTS = ("consumed", "dropped", "abandoned", "unused")
"""A work id's account ends with exactly one of these (``docs/faults.md``)."""
TERMINAL_SQL = ", ".join(f"'{e}'" for e in TERMINAL_EVENTS)
"""The same, as an SQL list: ``event IN ({TERMINAL_SQL})``."""

WORK_ACCOUNT_SQL = f"""
WITH per_id AS (
  SELECT work_id,
         bool_or(event = 'issued') AS issued,
         count(*) FILTER (WHERE event = 'reissued') AS reissues,
         count(*) FILTER (WHERE event = 'rescored') AS rescores,
         bool_or(event = 'completed') AS completed,
         count(*) FILTER (WHERE event IN ({TERMINAL_SQL})) AS endings,
         bool_or(event = 'consumed') AS consumed, bool_or(event = 'dropped') AS dropped,
         bool_or(event = 'abandoned') AS abandoned, bool_or(event = 'unused') AS unused
  FROM work_items GROUP BY work_id)
SELECT count(*) FILTER (WHERE issued) AS issued,
       count(*) FILTER (WHERE completed) AS completed,
       coalesce(sum(reissues), 0) AS reissued,
       coalesce(sum(rescores), 0) AS rescored,
       count(*) FILTER (WHERE consumed) AS consumed,
       count(*) FILTER (WHERE dropped) AS dropped,
       count(*) FILTER (WHERE abandoned) AS abandoned,
       count(*) FILTER (WHERE unused) AS unused,
       count(*) FILTER (WHERE issued AND endings = 0) AS lost,
       count(*) FILTER (WHERE endings > 1) AS counted_twice
FROM per_id"""
"""Every issued work id ends exactly once: consumed by a train step, dropped (with a reason),
abandoned by a dead controller, or unused when the run ended. ``lost`` and ``counted_twice``
must be 0 (docs/faults.md)."""


def work_account(query: Any) -> dict[str, int]:
    """The ``work_items`` account of a run (see :data:`WORK_ACCOUNT_SQL`)."""
    row = query(WORK_ACCOUNT_SQL).to_pylist()[0]
    return {f"work_{k}": int(v or 0) for k, v in row.items()}
