"""``rlmesh mcp``: a Model Context Protocol server (stdio) over rlmesh runs, for AI agents.

Built on the official ``mcp`` Python SDK (``pip install 'rlmesh[agents]'``). Every tool
answers with one JSON object (structured content). Reads go through the same read-only
path as ``rlmesh sql`` (the live service while a run is up, the file opened read-only
after), so no tool can write to a database or run code. Tools:

- ``list_runs``, ``schema``, ``query`` (read-only SQL, rows capped), ``run_status``,
  ``logs``, ``stacks`` (``take_now`` asks a live run's procs for a fresh dump);
- with ``--allow-control`` only: ``inject_fault`` (SIGKILL or SIGSTOP a named proc of a
  live run on this host) and ``stop_run`` (SIGTERM to its controller: a clean stop).

The guide an agent should read first is ``docs/agents.md``.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from rlmesh import settings
from rlmesh.telemetry import introspect, reader
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.cli import FORMAT_VERSION, _jsonable, type_name
from rlmesh.telemetry.errors import TelemetryError
from rlmesh.telemetry.schema import DOCUMENTED

DEFAULT_ROWS = 100
MAX_ROWS = 5000
INSTRUCTIONS = """rlmesh runs: every rollout, train step, proc restart, log line and stack in SQL (DuckDB).
Start with list_runs, then run_status(run) for the shape of one run, schema(run) for its tables.
query(sql) runs read-only DuckDB SQL (rows capped by `limit`); logs(...) and stacks(...) are shortcuts.
Run defaults to 'latest'. Timestamps are ISO 8601 UTC. Nothing here can change a run's data."""


def _table_json(tbl: Any, run: str, limit: int | None = None) -> dict[str, Any]:
    truncated = limit is not None and tbl.num_rows > limit
    if truncated:
        tbl = tbl.slice(0, limit)
    rows = [{k: _jsonable(v) for k, v in r.items()} for r in tbl.to_pylist()]
    return {"format_version": FORMAT_VERSION, "run": run,
            "columns": [{"name": f.name, "type": type_name(f.type)} for f in tbl.schema],
            "rows": rows, "row_count": len(rows), "truncated": truncated}


def _run_dir(run: str) -> Path:
    """The run ``run`` names, only inside the runs folder this server serves (``--runs-dir``): an
    agent's ``run`` is a name, never a way to open any DuckDB file on the host (``../``, a path)."""
    root = runs.runs_dir()
    d = runs.resolve_run(run or "latest")
    if not d.resolve().is_relative_to(root):
        raise TelemetryError(f"run {run!r} is outside the runs folder {root}: give a run id from list_runs "
                             "(the server reads only runs under --runs-dir)")
    return d


def _limit(limit: int) -> int:
    if not 1 <= int(limit) <= MAX_ROWS:
        raise ValueError(f"limit={limit}: use 1..{MAX_ROWS}; aggregate in SQL for more")
    return int(limit)


def _bounded(sql: str, limit: int) -> str:
    """Wrap one SELECT so at most ``limit + 1`` rows leave the database (the +1 tells 'truncated')."""
    import duckdb  # deferred: DuckDB is heavy; loaded by the one tool that opens a file

    stmts = duckdb.extract_statements(sql)
    if len(stmts) != 1:
        raise ValueError("query takes exactly one statement")
    if str(stmts[0].type).rsplit(".", 1)[-1] != "SELECT":
        return sql  # DESCRIBE / SHOW / EXPLAIN: small results
    body = sql.strip().rstrip(";")
    return f"SELECT * FROM ({body}) AS q LIMIT {limit + 1}"


# ---- the tools (plain functions: tested without a server, registered below) ---------------------

def list_runs() -> dict[str, Any]:
    """Every run under RLMESH_RUNS_DIR (oldest first): id, status (running|ok|failed|crashed), start, end, rows."""
    out = [{"id": r["id"], "status": r["status"], "start_ts": r.get("start_ts"), "end_ts": r.get("end_ts"),
            "rows": r.get("rows"), "argv": " ".join(r.get("argv") or [])} for r in runs.list_runs()]
    return {"format_version": FORMAT_VERSION, "runs_dir": str(runs.runs_dir()), "runs": _jsonable(out)}


def schema(run: str = "latest") -> dict[str, Any]:
    """Every table of the run and every column, with its type and documented meaning."""
    run_dir = _run_dir(run)
    tables: dict[str, Any] = {}
    for r in reader.tables(run_dir).to_pylist():
        t = tables.setdefault(r["table"], {
            "doc": DOCUMENTED[r["table"]].doc if r["table"] in DOCUMENTED else "user table", "columns": []})
        t["columns"].append({"name": r["column"], "type": type_name(r["type"]), "description": r["description"]})
    return {"format_version": FORMAT_VERSION, "run": run_dir.name, "tables": tables}


def query(sql: str, run: str = "latest", limit: int = DEFAULT_ROWS, timeout_s: float | None = None) -> dict[str, Any]:
    """Read-only DuckDB SQL (SELECT/WITH/DESCRIBE/SHOW/EXPLAIN) over one run; at most `limit` rows come back.
    timeout_s: stop the query after this many seconds (default RLMESH_QUERY_TIMEOUT_S, 60)."""
    run_dir = _run_dir(run)
    n = _limit(limit)
    return _table_json(reader.query_run_dir(run_dir, _bounded(sql, n), timeout_s), run_dir.name, n)


def run_status(run: str = "latest") -> dict[str, Any]:
    """Status of a run: live or not, meshes, each proc's latest event and restarts, training progress, last eval."""
    return {"format_version": FORMAT_VERSION, **_jsonable(introspect.run_status(_run_dir(run)))}


def logs(run: str = "latest", proc: str | None = None, mesh: str | None = None, rank: int | None = None,
         level: str | None = None, stream: str | None = None, contains: str | None = None,
         before: str | None = None, after: str | None = None, incarnation: int | None = None,
         limit: int = DEFAULT_ROWS) -> dict[str, Any]:
    """The latest `limit` log rows matching the filters, oldest first. level = this level and up (logging records);
    stream = stdout|stderr|log; before/after = ISO timestamps; incarnation = one process of the proc. What a proc
    wrote before dying: proc + the incarnation of its `died` row in the actors table (not a time window: the
    replacement may print within milliseconds of the death)."""
    run_dir = _run_dir(run)
    sql = introspect.log_query(mesh=mesh, rank=rank, proc=proc, level=level, stream=stream, contains=contains,
                               before=before, after=after, incarnation=incarnation, limit=_limit(limit))
    return _table_json(reader.query_run_dir(run_dir, sql), run_dir.name)


def stacks(run: str = "latest", proc: str | None = None, take_now: bool = False,
           limit: int = 2000) -> dict[str, Any]:
    """Python stack frames (one row per frame) of each proc's latest dump; take_now=True first asks the live
    run's procs (on this host) for a fresh dump. Dumps are also taken automatically before a hung proc is killed."""
    run_dir = _run_dir(run)
    taken = introspect.take_stacks(run_dir, proc) if take_now else {}
    dumps = [d for d in taken.values() if not d.startswith("not taken")]
    sql = introspect.stack_query(dump_ids=dumps) if take_now else introspect.stack_query(proc=proc)
    out = _table_json(reader.query_run_dir(run_dir, sql), run_dir.name, _limit(limit))
    out["taken"] = taken
    return out


def _live_pid(run_dir: Path, proc: str) -> int:
    if not runs.live_service(run_dir):
        raise TelemetryError(f"run {run_dir.name} is not live")
    for p in introspect.procs(run_dir):
        if p.proc == proc:
            if not p.alive or p.pid is None:
                raise TelemetryError(f"proc {proc} is not alive (latest event: {p.event})")
            if p.host not in (socket.gethostname(), None):
                raise TelemetryError(f"proc {proc} runs on {p.host}; control works on the controller's host only")
            return int(p.pid)
    raise TelemetryError(f"no proc {proc!r} in run {run_dir.name}")


def inject_fault(proc: str, kind: str = "kill", run: str = "latest") -> dict[str, Any]:
    """Control (needs --allow-control): kind='kill' SIGKILLs the proc, 'hang' SIGSTOPs it (the heartbeat catches
    it). The run's restart policy then applies, and the actors table records what happened."""
    if kind not in ("kill", "hang"):
        raise ValueError(f"kind={kind!r}: use 'kill' or 'hang'")
    run_dir = _run_dir(run)
    pid = _live_pid(run_dir, proc)
    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    return {"format_version": FORMAT_VERSION, "run": run_dir.name, "proc": proc, "pid": pid, "kind": kind, "ok": True}


def stop_run(run: str = "latest") -> dict[str, Any]:
    """Control (needs --allow-control): SIGTERM to the run's controller, on this host: the clean stop
    Ctrl-C gives (procs stopped, final checkpoint, ``interrupted``). Not SIGINT: a controller started
    in the background of a script (``rlmesh run ... &``) ignores SIGINT, as shells arrange."""
    run_dir = _run_dir(run)
    info = runs.live_service(run_dir)
    if not info:
        raise TelemetryError(f"run {run_dir.name} is not live")
    if info.get("host") != socket.gethostname():
        raise TelemetryError(f"run {run_dir.name}'s controller runs on {info.get('host')}, not on this host")
    os.kill(int(info["pid"]), signal.SIGTERM)
    return {"format_version": FORMAT_VERSION, "run": run_dir.name, "pid": int(info["pid"]), "ok": True}


READ_TOOLS = (list_runs, schema, query, run_status, logs, stacks)
CONTROL_TOOLS = (inject_fault, stop_run)


def _clear_errors(fn: Any, tool_error: type[Exception]) -> Any:
    """The tool, raising the SDK's ToolError with our message (the SDK hides other exceptions' text)."""
    @functools.wraps(fn)
    def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure reaches the agent as a clear error result
            raise tool_error(f"{type(exc).__name__}: {exc}") from exc

    return tool


def build_server(allow_control: bool = False) -> Any:
    """The MCP server with the read tools (and the control tools when ``allow_control``)."""
    from mcp.server.mcpserver import MCPServer  # deferred: optional extra rlmesh[agents], heavy: imported when serving
    from mcp.server.mcpserver.exceptions import ToolError  # deferred: optional extra rlmesh[agents]

    server = MCPServer("rlmesh", instructions=INSTRUCTIONS, log_level="WARNING")
    for fn in READ_TOOLS + (CONTROL_TOOLS if allow_control else ()):
        server.add_tool(_clear_errors(fn, ToolError), structured_output=True)
    return server


def mcp_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rlmesh mcp", description=__doc__.split("\n")[0])
    ap.add_argument("--allow-control", action="store_true",
                    help="also offer inject_fault and stop_run (they act on live runs on this host)")
    ap.add_argument("--runs-dir", help="where runs are (default: $RLMESH_RUNS_DIR or ./runs)")
    a = ap.parse_args(argv)
    if a.runs_dir:
        settings.RUNS_DIR.set(a.runs_dir)
    try:
        server = build_server(a.allow_control)
    except ImportError as exc:
        print(f"rlmesh mcp: the MCP SDK is not installed ({exc}); pip install 'rlmesh[agents]'", file=sys.stderr)
        return 2
    server.run("stdio")
    return 0
