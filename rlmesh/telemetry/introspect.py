"""Questions about one run, answered through the read-only query path: its logs, its stacks, its procs' state.

Shared by ``rlmesh logs``, ``rlmesh stacks`` and ``rlmesh mcp``, so a person and an
agent get the same answers. Every read goes through
:func:`rlmesh.telemetry.reader.query_run_dir` (the live service while the run is up,
the file read-only after), so nothing here can write to the database. The one action,
:func:`take_stacks`, sends ``SIGUSR2`` to procs of a live run on this host: their
faulthandler dumps every thread's stack to the launcher, which stores it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlmesh.telemetry import reader
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.errors import TelemetryError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ALIVE_EVENTS = ("spawned", "restarted", "recovered")
STACK_SIGNAL = signal.SIGUSR2


def lit(value: Any) -> str:
    """A SQL literal (strings quoted, quotes doubled); the query path takes no parameters."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def levels_at_least(level: str) -> tuple[str, ...]:
    lv = level.upper()
    if lv not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    return LEVELS[LEVELS.index(lv):]


def log_query(*, mesh: str | None = None, rank: int | None = None, proc: str | None = None,
              level: str | None = None, stream: str | None = None, contains: str | None = None,
              after: str | None = None, before: str | None = None, incarnation: int | None = None,
              limit: int = 200) -> str:
    """SQL for the last ``limit`` matching ``logs`` rows, oldest first. ``after``/``before``: ISO timestamps.
    ``incarnation``: that process of the proc only (what it wrote before dying: the died row's incarnation)."""
    where = []
    if mesh is not None:
        where.append(f"mesh = {lit(mesh)}")
    if rank is not None:
        where.append(f"rank = {int(rank)}")
    if proc is not None:
        where.append(f"proc = {lit(proc)}")
    if level is not None:
        where.append("level IN (" + ", ".join(lit(x) for x in levels_at_least(level)) + ")")
    if stream is not None:
        where.append(f"stream = {lit(stream)}")
    if incarnation is not None:
        where.append(f"incarnation = {int(incarnation)}")
    if contains is not None:
        where.append(f"contains(message, {lit(contains)})")
    if after is not None:
        where.append(f"ts > {lit(after)}::TIMESTAMPTZ")
    if before is not None:
        where.append(f"ts < {lit(before)}::TIMESTAMPTZ")
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    return (f"SELECT * FROM (SELECT ts, mesh, rank, proc, incarnation, stream, level, logger, message, exception, "
            f"actor FROM logs {cond} ORDER BY ts DESC LIMIT {int(limit)}) ORDER BY ts")


@dataclass(frozen=True)
class ProcSnapshot:
    proc: str
    mesh: str
    rank: int
    host: str | None
    pid: int | None
    incarnation: int | None
    event: str  # its latest lifecycle event
    restarts: int

    @property
    def alive(self) -> bool:
        return self.event in ALIVE_EVENTS


PROCS_SQL = """
SELECT proc, mesh, rank,
       arg_max(host, ts) AS host, arg_max(pid, ts) FILTER (WHERE pid IS NOT NULL) AS pid,
       arg_max(incarnation, ts) AS incarnation,
       arg_max(event, ts) FILTER (WHERE event NOT IN ('fault_injected', 'restart_requested')) AS event,
       count(*) FILTER (WHERE event = 'restarted') AS restarts
FROM actors GROUP BY proc, mesh, rank ORDER BY mesh, rank
"""


def procs(run_dir: Path) -> list[ProcSnapshot]:
    """Every proc of the run with its latest lifecycle event and restart count."""
    return [ProcSnapshot(r["proc"], r["mesh"], r["rank"], r["host"], r["pid"], r["incarnation"], r["event"] or "",
                      r["restarts"]) for r in reader.query_run_dir(run_dir, PROCS_SQL).to_pylist()]


def _handles_stack_signal(pid: int) -> bool:
    """Whether ``pid`` is an rlmesh worker that catches SIGUSR2 (its default action would kill it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"rlmesh.worker" not in f.read():
                return False
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(caught & (1 << (STACK_SIGNAL - 1)))


def take_stacks(run_dir: Path, proc: str | None = None, timeout: float = 5.0) -> dict[str, str]:
    """Have live procs (all, or ``proc``) dump their stacks; wait until the dumps are in ``stacks``.

    Returns ``{proc: dump_id}``; a proc that could not be asked or did not answer maps to
    an explanation starting with ``"not taken: "``. Only procs on this host can be asked.
    """
    if not runs.live_service(run_dir):
        raise TelemetryError(f"run {run_dir.name} is not live: its stored stacks are all there is")
    here = socket.gethostname()
    targets = [p for p in procs(run_dir) if p.alive and (proc is None or p.proc == proc)]
    if proc is not None and not targets:
        raise TelemetryError(f"no live proc {proc!r} in run {run_dir.name}; see: rlmesh sql "
                             f"{run_dir.name} \"SELECT DISTINCT proc FROM actors\"")
    out: dict[str, str] = {}
    t0 = time.time() - 0.05
    asked = []
    for p in targets:
        if p.host not in (here, None) or p.pid is None:
            out[p.proc] = f"not taken: proc runs on {p.host}, not on this host"
        elif not _handles_stack_signal(p.pid):
            out[p.proc] = "not taken: its process does not capture stacks (RLMESH_CAPTURE=0, or not a local worker)"
        else:
            try:
                os.kill(p.pid, STACK_SIGNAL)
                asked.append(p)
            except ProcessLookupError:
                out[p.proc] = "not taken: the process is gone"
    since = dt.datetime.fromtimestamp(t0, dt.timezone.utc).isoformat()
    deadline = time.monotonic() + timeout
    while asked:
        rows = reader.query_run_dir(run_dir, (
            "SELECT proc, arg_max(dump_id, ts) AS dump_id FROM stacks WHERE ts >= "
            f"{lit(since)}::TIMESTAMPTZ AND proc IN ({', '.join(lit(p.proc) for p in asked)}) GROUP BY proc")).to_pylist()
        for r in rows:
            out[r["proc"]] = r["dump_id"]
        asked = [p for p in asked if p.proc not in out]
        if not asked or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for p in asked:
        out[p.proc] = f"not taken: no dump within {timeout:.0f}s (a stopped process cannot answer)"
    return out


def stack_query(*, proc: str | None = None, dump_ids: list[str] | None = None, latest: bool = True) -> str:
    """SQL for stack frames: given dumps, or each proc's latest dump (``latest``), or every dump."""
    where = []
    if proc is not None:
        where.append(f"proc = {lit(proc)}")
    if dump_ids is not None:
        where.append("dump_id IN (" + (", ".join(lit(d) for d in dump_ids) or "NULL") + ")")
    cond = " AND ".join(where) or "true"
    cols = ("ts, mesh, rank, proc, incarnation, pid, dump_id, reason, thread, thread_name, current, depth, "
            "function, file, line")
    if latest and dump_ids is None:
        return (f"WITH s AS (SELECT * FROM stacks WHERE {cond}), "
                "last AS (SELECT proc, arg_max(dump_id, ts) AS dump_id FROM s GROUP BY proc) "
                f"SELECT {cols} FROM s JOIN last USING (proc, dump_id) ORDER BY proc, current DESC, thread, depth")
    return f"SELECT {cols} FROM stacks WHERE {cond} ORDER BY ts, proc, current DESC, thread, depth"


def format_stacks(tbl: pa.Table) -> str:
    """Frames as a person reads a traceback: per dump, per thread, outermost call first."""
    out: list[str] = []
    rows = tbl.to_pylist()
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dump_id"], r["thread"]), []).append(r)
    last_dump = None
    for (dump_id, thread), frames in groups.items():
        f0 = frames[0]
        if dump_id != last_dump:
            out.append(f"== {f0['proc']} ({f0['mesh']}[{f0['rank']}], pid {f0['pid']}, incarnation "
                       f"{f0['incarnation']}) at {f0['ts']}: {f0['reason']}")
            last_dump = dump_id
        name = f" {f0['thread_name']!r}" if f0["thread_name"] else ""
        out.append(f"  thread {thread}{name}{' (signal handled here)' if f0['current'] else ''}:")
        for fr in sorted(frames, key=lambda x: -x["depth"]):
            out.append(f"    {fr['file']}:{fr['line']} in {fr['function']}")
    return "\n".join(out)


def run_status(run_dir: Path) -> dict[str, Any]:
    """Where a run stands: its row in ``runs``, procs and restarts, warm-up phases, training progress, last eval,
    error count."""
    q = lambda sql: reader.query_run_dir(run_dir, sql).to_pylist()  # noqa: E731
    info = runs.read_json(run_dir / runs.RUN_JSON) or {}
    run_row = q("SELECT id, status, start_ts, end_ts, argv, host, pid FROM runs")
    plist = procs(run_dir)
    progress = q("SELECT max(step) AS step, max(policy_version) AS policy_version, count(*) AS train_steps, "
                 "arg_max(loss, ts) AS last_loss, max(ts) AS last_ts FROM train_steps")[0]
    progress.update(q("SELECT count(*) AS rollouts, sum(samples) AS samples FROM rollouts")[0])
    last_eval = q("SELECT step, policy_version, metric, value, ts FROM evals ORDER BY ts DESC LIMIT 1")
    errors = q("SELECT count(*) FILTER (WHERE level IN ('ERROR', 'CRITICAL')) AS error_records, "
               "count(*) AS lines FROM logs")[0]
    try:  # warm-up phases (SFT warm start, engine start) per mesh, over its ranks' latest rows
        warmup = q("WITH last AS (SELECT mesh, rank, phase, min(ts) AS first, arg_max(state, ts) AS state, "
                   "arg_max(completed, ts) AS completed, arg_max(total, ts) AS total, arg_max(elapsed_s, ts) AS e "
                   "FROM phases GROUP BY ALL) SELECT mesh, phase, count(*) AS ranks, "
                   "count(*) FILTER (WHERE state IN ('done', 'failed')) AS ranks_done, "
                   "count(*) FILTER (WHERE state = 'failed') AS failed, sum(completed)::BIGINT AS completed, "
                   "CASE WHEN count(total) = count(*) THEN sum(total)::BIGINT END AS total, max(e) AS elapsed_s "
                   "FROM last GROUP BY ALL ORDER BY min(first)")
    except Exception:  # noqa: BLE001 - a run file from before the phases table
        warmup = []
    return {
        "run": run_dir.name,
        "status": runs.run_status(info) if info else (run_row[0]["status"] if run_row else "unknown"),
        "live": bool(runs.live_service(run_dir)),
        "run_row": run_row[0] if run_row else None,
        "meshes": sorted({p.mesh for p in plist}),
        "procs": [dataclasses.asdict(p) | {"alive": p.alive} for p in plist],
        "restarts_total": sum(p.restarts for p in plist),
        "progress": progress,
        "warmup": warmup,
        "last_eval": last_eval[0] if last_eval else None,
        "logs": errors,
    }
