"""``rlmesh sql`` and ``rlmesh runs``: the telemetry at a shell prompt, for people and for agents.

People get a rich table (plain text when stdout is not a terminal); programs get
``--format json`` (one stable object, no ANSI codes, timestamps as ISO 8601 strings),
``csv`` or ``parquet``. Errors go to stderr with exit status 1 (2 for bad usage).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import decimal
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from rlmesh.telemetry import reader, run as runs
from rlmesh.telemetry.errors import TelemetryError
from rlmesh.telemetry.schema import DOCUMENTED

FORMATS = ("table", "csv", "json", "parquet")
#: Bumped only when a key of the JSON output changes meaning or goes away (new keys may appear): docs/agents.md.
FORMAT_VERSION = 1
MAX_TABLE_ROWS = 1000


def _jsonable(v: Any) -> Any:
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and v != v:
        return None  # NaN is not JSON
    return v


_DUCK_ALIASES = {"TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ", "TIME WITH TIME ZONE": "TIMETZ"}


def type_name(t: Any) -> str:
    """One naming of types everywhere (--schema, query results, MCP): DuckDB's, as docs/telemetry.md writes them.

    Takes a DuckDB type string or a pyarrow type (a query result's column)."""
    import pyarrow as pa  # deferred: pyarrow is heavy (rlmesh.telemetry's import-cost rule)

    if isinstance(t, str):
        return _DUCK_ALIASES.get(t.upper(), t.upper())
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"{type_name(t.value_type)}[]"
    if pa.types.is_struct(t):
        return "STRUCT(" + ", ".join(f"{f.name} {type_name(f.type)}" for f in t) + ")"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_interval(t):
        return "INTERVAL"
    simple = {pa.string(): "VARCHAR", pa.large_string(): "VARCHAR", pa.int64(): "BIGINT", pa.int32(): "INTEGER",
              pa.int16(): "SMALLINT", pa.int8(): "TINYINT", pa.uint64(): "UBIGINT", pa.uint32(): "UINTEGER",
              pa.float64(): "DOUBLE", pa.float32(): "FLOAT", pa.bool_(): "BOOLEAN", pa.binary(): "BLOB",
              pa.large_binary(): "BLOB", pa.date32(): "DATE", pa.null(): "NULL"}
    return simple.get(t, str(t).upper())


def to_json(tbl: Any, run: str | None) -> str:
    """``{"format_version", "run", "columns": [{"name", "type"}], "rows": [{...}], "row_count"}``, keys in column order."""
    cols = [{"name": f.name, "type": type_name(f.type)} for f in tbl.schema]
    rows = [{k: _jsonable(v) for k, v in r.items()} for r in tbl.to_pylist()]
    return json.dumps({"format_version": FORMAT_VERSION, "run": run, "columns": cols, "rows": rows,
                       "row_count": len(rows)}, ensure_ascii=False)


def _flatten_nested(tbl: Any) -> Any:
    """CSV has no lists or structs: write those columns as JSON text."""
    for i, f in enumerate(tbl.schema):
        if pa.types.is_nested(f.type):
            vals = [None if v is None else json.dumps(_jsonable(v)) for v in tbl.column(i).to_pylist()]
            tbl = tbl.set_column(i, f.name, pa.array(vals, type=pa.string()))
    return tbl


def interval_text(v: Any) -> str | None:
    """An INTERVAL (pyarrow's ``MonthDayNano``) as DuckDB writes it: ``1 year 2 months 3 days 01:30:00``."""
    if v is None:
        return None
    months, days, ns = v.months, v.days, v.nanoseconds
    parts = [f"{n} {unit}{'s' if abs(n) != 1 else ''}"
             for n, unit in ((int(months / 12), "year"), (months - 12 * int(months / 12), "month"), (days, "day")) if n]
    if ns or not parts:
        sec, frac = divmod(abs(ns), 10**9)
        clock = f"{'-' if ns < 0 else ''}{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
        parts.append(clock + (f".{frac:09d}".rstrip("0") if frac else ""))
    return " ".join(parts)


def _plain_columns(tbl: Any) -> Any:
    """INTERVAL columns as their text: CSV and Parquet writers (and the table) have no interval type."""
    for i, f in enumerate(tbl.schema):
        if pa.types.is_interval(f.type):
            tbl = tbl.set_column(i, f.name, pa.array([interval_text(v) for v in tbl.column(i).to_pylist()],
                                                     type=pa.string()))
    return tbl


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(_jsonable(v))
    return str(v)


def print_table(tbl: Any, title: str | None = None, out: Any = None) -> None:
    stream = out or sys.stdout
    # A pipe or file gets wide lines rather than 80-column wrapping; a terminal gets its width.
    console = Console(file=stream, soft_wrap=False, width=None if stream.isatty() else 200)
    t = Table(title=title, show_lines=False, header_style="bold")
    for f in tbl.schema:
        t.add_column(f.name, justify="right" if _numeric(f.type) else "left", overflow="fold")
    shown = tbl.slice(0, MAX_TABLE_ROWS)
    for row in shown.to_pylist():
        t.add_row(*(_cell(v) for v in row.values()))
    console.print(t)
    if tbl.num_rows > MAX_TABLE_ROWS:
        console.print(f"({tbl.num_rows - MAX_TABLE_ROWS} more rows; use --format csv/json/parquet --out FILE)")
    else:
        console.print(f"({tbl.num_rows} row{'s' if tbl.num_rows != 1 else ''})")


def _numeric(t: Any) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def write_result(tbl: Any, fmt: str, out: str | None, run: str | None, title: str | None = None) -> None:
    if fmt != "json":
        tbl = _plain_columns(tbl)
    if fmt == "parquet":
        import pyarrow.parquet as pq  # deferred: pyarrow.parquet / .csv load only when writing an --out file

        if out is None and sys.stdout.isatty():
            raise SystemExit("rlmesh sql: --format parquet writes binary; add --out FILE (or pipe stdout)")
        pq.write_table(tbl, out or sys.stdout.buffer)
        return
    if fmt == "csv":
        import pyarrow.csv as pcsv  # deferred: pyarrow.parquet / .csv load only when writing an --out file

        if out:
            pcsv.write_csv(_flatten_nested(tbl), out)
        else:
            sys.stdout.flush()
            pcsv.write_csv(_flatten_nested(tbl), sys.stdout.buffer)
        return
    stream = open(out, "w") if out else sys.stdout
    try:
        if fmt == "json":
            stream.write(to_json(tbl, run) + "\n")
        else:
            print_table(tbl, title, stream)
    finally:
        if out:
            stream.close()


_SQL_EXAMPLES = """examples:
  rlmesh sql "SELECT policy_version, avg(reward) FROM rollouts GROUP BY 1 ORDER BY 1"
  rlmesh sql latest "SELECT * FROM actors WHERE event = 'died'" --format json
  rlmesh sql 20261202-101500-a1b2 "SELECT * FROM spans" --format parquet --out spans.parquet
  rlmesh sql RUN_A --with RUN_B 'SELECT * FROM "RUN_A".evals UNION ALL SELECT * FROM "RUN_B".evals'
  rlmesh sql --schema                      # tables, columns, types and meanings
tables and ten useful queries: docs/telemetry.md"""


def _parser(prog: str, schema: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=("read-only SQL over a run's telemetry, live (through its service) or finished (the file)"
                     if schema else "list runs under $RLMESH_RUNS_DIR (default ./runs), oldest first"),
        epilog=_SQL_EXAMPLES if schema else None, formatter_class=argparse.RawDescriptionHelpFormatter)
    if schema:
        p.add_argument("args", nargs="*", metavar="[RUN] SQL",
                       help="RUN: run id, 'latest' (default), run directory or any DuckDB file")
        p.add_argument("--schema", action="store_true", help="list tables and columns with their meaning")
        p.add_argument("--with", dest="also", action="append", default=[], metavar="RUN",
                       help="query finished runs side by side: each is attached read-only under its run id")
        p.add_argument("--timeout", type=float, default=None, metavar="S",
                       help="stop the query after S seconds (default $RLMESH_QUERY_TIMEOUT_S, else 60)")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table (people; plain text when piped), json (one stable object, no ANSI), csv, parquet")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    return p


def sql_main(argv: list[str]) -> int:
    """``rlmesh sql [RUN] "SELECT ..."`` | ``rlmesh sql [RUN] --schema``."""
    p = _parser("rlmesh sql", schema=True)
    a = p.parse_intermixed_args(argv)
    if a.schema:
        if len(a.args) > 1:
            p.error("--schema takes at most a RUN")
        run, sql = (a.args[0] if a.args else None), None
    elif len(a.args) == 1:
        run, sql = None, a.args[0]
    elif len(a.args) == 2:
        run, sql = a.args
    else:
        p.error('give a query: rlmesh sql [RUN] "SELECT * FROM runs"')
    try:
        db = runs.resolve_db(run)
        label = runs.db_label(db)
        if a.schema:
            tbl = reader.tables(db)
            if a.format == "json":
                return _write_schema_json(tbl, label, a.out)
        else:
            tbl = reader.query(sql, [db, *a.also] if a.also else db, timeout=a.timeout)  # type: ignore[arg-type]  # sql is set on this branch
    except (TelemetryError, PermissionError, FileNotFoundError) as exc:
        print(f"rlmesh sql: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # SQL errors from DuckDB: show DuckDB's words
        print(f"rlmesh sql: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        if a.schema and a.format == "table":
            _print_schema(tbl, label)
        else:
            write_result(tbl, a.format, a.out, label, title=f"run {label}")
    except BrokenPipeError:  # `| head`: the reader has seen enough
        sys.stdout = open("/dev/null", "w")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:  # a type this format has no place for
        print(f"rlmesh sql: --format {a.format} cannot hold this result ({str(exc).splitlines()[0]}): cast that "
              "column in the query, e.g. CAST(col AS VARCHAR), or use --format json", file=sys.stderr)
        return 1
    return 0


def _print_schema(tbl: Any, run: str) -> None:
    rows = tbl.to_pylist()
    for name in dict.fromkeys(r["table"] for r in rows):
        part = [{"column": r["column"], "type": type_name(r["type"]), "description": r["description"]}
                for r in rows if r["table"] == name]
        doc = DOCUMENTED[name].doc if name in DOCUMENTED else "user table (types from its first batch)"
        print_table(pa.Table.from_pylist(part), title=f"{name}: {doc}")


def _write_schema_json(tbl: Any, run: str, out: str | None) -> int:
    tables: dict[str, Any] = {}
    for r in tbl.to_pylist():
        t = tables.setdefault(r["table"], {"doc": DOCUMENTED[r["table"]].doc if r["table"] in DOCUMENTED else "user table",
                                           "columns": []})
        t["columns"].append({"name": r["column"], "type": type_name(r["type"]), "description": r["description"]})
    text = json.dumps({"format_version": FORMAT_VERSION, "run": run, "tables": tables}, ensure_ascii=False)
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)
    return 0


def runs_main(argv: list[str]) -> int:
    """``rlmesh runs``: every run under ``$RLMESH_RUNS_DIR`` (default ./runs), oldest first."""
    a = _parser("rlmesh runs", schema=False).parse_args(argv)
    runs.settle_dead_runs()  # runs whose controller died: status stored, stale service.json removed
    rows = []
    for r in runs.list_runs():
        start, end = r.get("start_ts"), r.get("end_ts")
        rows.append({
            "id": r["id"], "status": r["status"],
            "start": dt.datetime.fromtimestamp(start, dt.timezone.utc) if start else None,
            "duration_s": round(end - start, 1) if start and end else None,
            "rows": r.get("rows"), "command": " ".join(r.get("argv") or []), "error": r.get("error"),
        })
    schema = pa.schema([("id", pa.string()), ("status", pa.string()), ("start", pa.timestamp("us", tz="UTC")),
                        ("duration_s", pa.float64()), ("rows", pa.int64()), ("command", pa.string()),
                        ("error", pa.string())])
    tbl = pa.Table.from_pylist(rows, schema=schema)
    write_result(tbl, a.format, a.out, None, title=f"runs in {runs.runs_dir()}")
    return 0
