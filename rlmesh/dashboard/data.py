"""What the dashboard's pages show, as plain data: every value read with read-only SQL.

Why a module apart from the web app: these functions are the whole contract between the
pages and the telemetry (tested without a browser), and the benchmark times them directly.
A run is named by its id under the runs directory (or ``latest``); paths are not accepted
from the browser, so a page can never open a file outside the runs directory.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import pyarrow as pa

from rlmesh.rl.run.report import WORK_ACCOUNT_SQL
from rlmesh.telemetry import charts
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.errors import RunNotFoundError
from rlmesh.telemetry.cli import to_json
from rlmesh.telemetry.reader import query_run_dir, tables
from rlmesh.telemetry.store import execute_read_only, open_read_only

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RunDirectory:
    """The runs the dashboard may show: those under ``root`` (default ``$RLMESH_RUNS_DIR``)."""

    def __init__(self, root: Path | None = None):
        self.root = (root or runs.runs_dir()).resolve()
        self._final: dict[str, Any] = {}  # finished runs' final eval, by run id (their file no longer changes)
        self._lock = threading.Lock()

    def resolve(self, run: str) -> Path:
        """``latest`` or a run id -> its directory; anything else (a path, ``..``) is refused."""
        if run == "latest":
            link = self.root / "latest"
            if runs.is_run_dir(link):
                return link.resolve()
            found = runs.list_runs(self.root)
            if found:
                return Path(found[-1]["path"])
        elif _RUN_ID.match(run) and runs.is_run_dir(self.root / run):
            return self.root / run
        raise RunNotFoundError(f"no run {run!r} under {self.root}")

    def query(self, run: str, sql: str, timeout: float | None = None) -> pa.Table:
        """Read-only SQL on one run (its live service, or its file read-only), stopped after ``timeout`` s
        (default ``RLMESH_QUERY_TIMEOUT_S``)."""
        return query_run_dir(self.resolve(run), sql, timeout)

    @contextlib.contextmanager
    def session(self, run: str) -> Iterator[Callable[[str], pa.Table]]:
        """A query function for one page refresh: a live run's service answers each query; a finished
        run's file is opened read-only once for the whole refresh (not once per chart) and closed at
        the end, so no connection outlives the request (a held one would block ``resume=``)."""
        run_dir = self.resolve(run)
        if runs.live_service(run_dir):
            yield charts.memoized(lambda sql: query_run_dir(run_dir, sql))
            return
        try:
            con = open_read_only({"run": run_dir / runs.DB_NAME})  # attached READ_ONLY, then locked down
        except duckdb.IOException:  # its controller came back (resumed) in between: ask it
            yield charts.memoized(lambda sql: query_run_dir(run_dir, sql))
            return
        try:
            yield charts.memoized(lambda sql: execute_read_only(con, sql, catalog="run"))
        finally:
            con.close()

    def runs(self) -> list[RunSummary]:
        """Every run, newest first, with its status, recipe, duration and final evaluation."""
        out = []
        for info in reversed(runs.list_runs(self.root)):
            run_id, status = info["id"], info["status"]
            start, end = info.get("start_ts"), info.get("end_ts")
            duration = (end or (time.time() if status == "running" else None) or start or 0) - start if start else None
            out.append(RunSummary(run_id, status, _recipe(info), round(duration, 1) if duration is not None else None,
                                  start, *self._final_eval(run_id, status)))
        return out

    def _final_eval(self, run_id: str, status: str) -> tuple[str | None, float | None, int | None]:
        with self._lock:
            if run_id in self._final:
                return self._final[run_id]
        try:
            rows = self.query(run_id, "SELECT metric, value, env_steps FROM evals ORDER BY ts DESC LIMIT 1").to_pylist()
        except Exception:  # noqa: BLE001 - one unreadable run must not hide the others
            rows = []
        found = (rows[0]["metric"], rows[0]["value"], rows[0]["env_steps"]) if rows else (None, None, None)
        if status != "running":
            with self._lock:
                self._final[run_id] = found
        return found


def _recipe(info: dict[str, Any]) -> str:
    """``recipe=...`` from the command line, else the program (``recipe.json``), else the command."""
    argv = info.get("argv") or []
    for a in argv:
        if isinstance(a, str) and a.startswith("recipe="):
            return a.split("=", 1)[1]
    saved = runs.read_json(Path(info["path"]) / "recipe.json")
    if saved and saved.get("program"):
        return str(saved["program"])
    return " ".join(map(str, argv))[-60:]


@dataclass
class RunSummary:
    id: str
    status: str
    recipe: str
    duration_s: float | None
    start_ts: float | None
    final_metric: str | None
    final_value: float | None
    final_env_steps: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def chart_page(rd: RunDirectory, run: str, page: charts.Page) -> list[dict[str, Any]]:
    """Every chart of ``page`` for ``run``, as JSON-ready dicts (plus proc deaths on the run page)."""
    with rd.session(run) as q:
        out = [charts.evaluate(spec, q).to_json() for spec in charts.on_page(page)]
        if page == charts.Page.RUN:
            out.append(charts.evaluate(charts.DEATHS, q).to_json())
    return out


def compare(rd: RunDirectory, run_ids: list[str], chart_id: str) -> dict[str, Any]:
    """One chart with the series of every run in ``run_ids`` overlaid (names prefixed by run id)."""
    spec = charts.BY_ID.get(chart_id)
    if spec is None or chart_id not in charts.COMPARABLE:
        raise ValueError(f"chart {chart_id!r} cannot be compared; use one of {', '.join(charts.COMPARABLE)}")
    merged: charts.ChartData | None = None
    for run_id in run_ids:
        with rd.session(run_id) as q:
            data = charts.evaluate(spec, q, series_prefix=f"{run_id} ")
        if merged is None:
            merged = data
        else:
            merged.series += data.series
            merged.rows += data.rows
    assert merged is not None
    return merged.to_json()


PROCS_SQL = """
SELECT mesh, rank, proc, arg_max(event, ts) FILTER (WHERE event <> 'recovered') AS state, arg_max(pid, ts) AS pid,
       max(incarnation) AS incarnation, count(*) FILTER (WHERE event = 'died') AS deaths,
       count(*) FILTER (WHERE event = 'restarted') AS restarts, max(ts) AS last_event_at,
       arg_max(actors, ts) FILTER (WHERE actors IS NOT NULL) AS actors
FROM actors WHERE proc IS NOT NULL GROUP BY mesh, rank, proc ORDER BY mesh, rank, proc"""
"""Every proc with its current state (its latest lifecycle event)."""

EVENTS_SQL = """
SELECT ts, round(epoch(ts) - (SELECT min(epoch(start_ts)) FROM runs), 2) AS t_s, mesh, rank, proc, event,
       incarnation, pid, signal, exit_code, reason, round(serving_s, 3) AS serving_s, round(recovery_s, 3) AS recovery_s
FROM actors WHERE event IN ('died', 'restarted', 'recovered', 'fault_injected', 'gave_up') ORDER BY ts"""
"""The timeline of deaths, restarts (serving again), recoveries (progress again) and injected faults."""


def meshes(rd: RunDirectory, run: str) -> dict[str, Any]:
    """The meshes page: procs and their state, the fault timeline, recovery times, the work-item account."""
    with rd.session(run) as q:
        account = q(WORK_ACCOUNT_SQL).to_pylist()[0]
        return {"procs": json.loads(to_json(q(PROCS_SQL), run)), "events": json.loads(to_json(q(EVENTS_SQL), run)),
                "work": {k: int(v or 0) for k, v in account.items()},
                "timeline": [charts.evaluate(charts.BY_ID["proc_events"], q).to_json()]}


SAMPLES_SQL = """
SELECT ts, policy_version, reward, source, answer, prompt, completion FROM samples ORDER BY ts DESC LIMIT 100"""
"""The newest sampled completions (an LLM run's ``samples`` table)."""


def samples(rd: RunDirectory, run: str) -> dict[str, Any]:
    """The samples page: the newest completions with their prompts, answers and rewards (an empty
    table for runs that have none: gym recipes, or runs recorded before the table existed)."""
    with rd.session(run) as q:
        try:
            return json.loads(to_json(q(SAMPLES_SQL), run))
        except Exception as exc:  # noqa: BLE001 - only a missing table is expected here; anything else is raised
            if "samples" not in str(exc) or "not exist" not in str(exc):
                raise
            return {"columns": [], "rows": []}


def schema(rd: RunDirectory, run: str) -> list[dict[str, Any]]:
    """Tables and columns of ``run`` with their documented meaning (shown beside the SQL box)."""
    return tables(rd.resolve(run)).to_pylist()
