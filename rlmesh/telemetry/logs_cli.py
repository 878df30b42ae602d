"""``rlmesh logs`` and ``rlmesh stacks``: shortcuts over the ``logs`` and ``stacks`` tables.

    rlmesh logs [RUN] [--mesh M] [--rank R] [--proc P] [--level L] [--grep TEXT] [-n N] [--follow]
    rlmesh stacks [RUN] [--proc P] [--stored] [--format text|json]

Both read through the same read-only path as ``rlmesh sql``; ``--format json`` prints
the ``rlmesh sql --format json`` object (see docs/agents.md).
"""

from __future__ import annotations

from rlmesh.telemetry import introspect, reader
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.errors import TelemetryError
import datetime as dt
import argparse
import sys
import time
from typing import Any

from rlmesh.telemetry.cli import to_json


def _base(prog: str, doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=doc)
    ap.add_argument("run", nargs="?", default="latest", help="run id, 'latest' (default), run dir or .duckdb file")
    ap.add_argument("--proc", help="one proc, e.g. procs.3")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    return ap


def _line(r: dict[str, Any]) -> str:
    ts = r["ts"].strftime("%H:%M:%S.%f")[:-3] if r["ts"] is not None else "?"
    where = f"{r['mesh']}[{r['rank']}]" if r["rank"] is not None and r["rank"] >= 0 else r["mesh"]
    if r["stream"] == "log":
        text = f"{r['level']} {r['logger']}: {r['message']}"
    else:
        text = r["message"] if r["stream"] == "stdout" else f"(stderr) {r['message']}"
    if r.get("exception"):
        text += "\n" + r["exception"]
    return "\n".join(f"{ts} [{where}] {t}" for t in text.split("\n"))


def logs_main(argv: list[str]) -> int:
    """Print a run's log lines (newest last); ``--follow`` keeps printing new ones while the run is live."""

    ap = _base("rlmesh logs", "a run's stdout/stderr lines and logging records, oldest first")
    ap.add_argument("--mesh")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--level", help="this level and above (logging records only): DEBUG INFO WARNING ERROR CRITICAL")
    ap.add_argument("--stream", choices=("stdout", "stderr", "log"))
    ap.add_argument("--grep", help="only lines containing this text")
    ap.add_argument("-n", "--lines", type=int, default=200, help="how many of the latest lines (default 200)")
    ap.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the run ends")
    a = ap.parse_args(argv)
    filters = dict(mesh=a.mesh, rank=a.rank, proc=a.proc, level=a.level, stream=a.stream, contains=a.grep)
    try:
        run_dir = runs.resolve_run(a.run)
        tbl = reader.query_run_dir(run_dir, introspect.log_query(**filters, limit=a.lines))
    except (TelemetryError, ValueError) as exc:
        print(f"rlmesh logs: {exc}", file=sys.stderr)
        return 1
    if a.format == "json":
        print(to_json(tbl, run_dir.name))
        return 0
    rows = tbl.to_pylist()
    if not rows:  # an empty screen reads as a hang or a bug: say what was asked and that nothing matched
        asked = " ".join(f"--{'grep' if k == 'contains' else k} {v}" for k, v in filters.items() if v is not None)
        print(f"rlmesh logs: no log lines in run {run_dir.name}{' matching ' + asked if asked else ''}"
              f"{'; waiting for new ones' if a.follow else ''}", file=sys.stderr, flush=True)
    try:
        for r in rows:
            print(_line(r))
        sys.stdout.flush()
        if not a.follow:
            return 0
        last = rows[-1]["ts"] if rows else None
        seen = {(r["proc"], r["ts"], r["message"]) for r in rows if r["ts"] == last}
        while True:
            live = runs.live_service(run_dir)
            after = _just_before(last) if last is not None else None  # same-ts rows are told apart by `seen`
            new = reader.query_run_dir(run_dir, introspect.log_query(**filters, after=after, limit=10_000)).to_pylist()
            for r in new:
                key = (r["proc"], r["ts"], r["message"])
                if key in seen:
                    continue
                print(_line(r))
                if r["ts"] != last:
                    last, seen = r["ts"], set()
                seen.add(key)
            sys.stdout.flush()
            if not live:
                return 0
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        sys.stdout = open("/dev/null", "w")
        return 0


def _just_before(ts: Any) -> str:

    return (ts - dt.timedelta(microseconds=1)).isoformat()


def stacks_main(argv: list[str]) -> int:
    """Dump the stacks of a live run's procs into ``stacks`` and print them; ``--stored``: print the last stored ones."""

    ap = _base("rlmesh stacks", "Python stacks of every thread of a run's procs, stored in the stacks table")
    ap.add_argument("--stored", action="store_true", help="do not take new dumps; show each proc's latest stored one")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the dumps (default 5)")
    a = ap.parse_args(argv)
    try:
        run_dir = runs.resolve_run(a.run)
        taken: dict[str, str] = {}
        if not a.stored and runs.live_service(run_dir):
            taken = introspect.take_stacks(run_dir, a.proc, a.timeout)
            for proc, what in taken.items():
                if what.startswith("not taken"):
                    print(f"rlmesh stacks: {proc}: {what}", file=sys.stderr)
        elif not a.stored:
            print(f"rlmesh stacks: run {run_dir.name} is not live; showing its stored stacks", file=sys.stderr)
        dumps = [d for d in taken.values() if not d.startswith("not taken")]
        if taken:
            if not dumps:
                return 1
            sql = introspect.stack_query(dump_ids=dumps)
        else:
            sql = introspect.stack_query(proc=a.proc, latest=True)
        tbl = reader.query_run_dir(run_dir, sql)
    except (TelemetryError, ValueError) as exc:
        print(f"rlmesh stacks: {exc}", file=sys.stderr)
        return 1
    if a.format == "json":
        print(to_json(tbl, run_dir.name))
    elif tbl.num_rows:
        print(introspect.format_stacks(tbl))
    else:
        print(f"(no stacks stored in run {run_dir.name}{' for ' + a.proc if a.proc else ''})")
    return 0
