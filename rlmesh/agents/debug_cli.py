"""``rlmesh debug``: list the actors paused in a live run (``breakpoint()``, or post-mortem), and attach pdb to one.

    rlmesh debug [RUN]                    # paused actors: id, proc, pid, where, since when
    rlmesh debug [RUN] --attach ACTOR     # an interactive pdb session (ACTOR: id, or mesh[rank])

The session goes over the same authenticated transport as all rlmesh traffic (each
message carries a MAC keyed by the job's secret, read from the run's ``service.json``,
mode 0600): only someone who can read that file can attach. ``continue`` resumes the
actor and ends the session; Ctrl-C ends the session by sending ``continue`` too.
See :mod:`rlmesh.actor.debugger` for the actor's side.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

import zmq

from rlmesh.actor import protocol as P
from rlmesh.actor.debugger import ATTACH, DETACHED, INPUT, OUTPUT
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.reader import query_run_dir
from rlmesh.transport.auth import Authenticator
from rlmesh.transport.sockets import connect_channel, tune, zmq_context


_PAUSED_SQL = """
SELECT d.actor, d.mesh, d.rank, d.proc, d.host, d.pid, d.addr, d.file, d.line, d.function, d.reason, d.since
FROM debug_sessions d
WHERE d.event = 'paused'
  AND NOT EXISTS (SELECT 1 FROM debug_sessions r WHERE r.event = 'resumed' AND r.addr = d.addr)
  AND NOT EXISTS (SELECT 1 FROM actors a WHERE a.proc = d.proc AND a.event IN ('died', 'stopped', 'gave_up')
                  AND epoch(a.ts) >= d.since)
ORDER BY d.since
"""


def paused(run_dir: Path) -> list[dict[str, Any]]:
    """Actors paused in a live run, oldest first: the records local procs leave in ``run_dir/debug``
    (kept while their process lives) and the ``debug_sessions`` rows of every proc, on any host
    (kept until a ``resumed`` row, or until the proc died or stopped)."""
    here = socket.gethostname()
    found: dict[str, dict[str, Any]] = {}
    for f in sorted((run_dir / "debug").glob("*.json")):
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if runs.pid_alive(int(info.get("pid", -1))):
            found[info["addr"]] = info
    try:
        rows = query_run_dir(run_dir, _PAUSED_SQL).to_pylist()
    except Exception:  # noqa: BLE001 - no pause recorded yet (no table), or telemetry off
        rows = []
    for r in rows:
        if r["host"] == here and not runs.pid_alive(int(r["pid"])):
            continue  # a local process that is gone (its death may not be a row yet)
        found.setdefault(r["addr"], r)
    return sorted(found.values(), key=lambda i: i["since"])


def _pick(entries: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    for e in entries:
        if name in (e["actor"], f"{e['mesh']}[{e['rank']}]", e.get("proc")):
            return e
    return None


def attach(info: dict[str, Any], secret: bytes, stdin: Any = None, stdout: Any = None,
           alive: Callable[[], bool] | None = None) -> int:
    """Run the interactive session until the actor resumes (returns 0) or the actor is gone (1).

    ``alive``: whether the paused actor's process still exists, asked while the session is idle
    (default: its pid, which only means something on this host)."""
    alive = alive or (lambda: runs.pid_alive(int(info["pid"])))
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    sock = tune(zmq_context().socket(zmq.DEALER))
    auth = connect_channel(sock, Authenticator(secret), info["addr"])  # our session; replies checked on `back`
    back = auth.reply_inbound(f"debugger of {info['actor']}")
    sock.send_multipart(P.control(auth, ATTACH), copy=False)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(stdin.fileno(), zmq.POLLIN)
    try:
        while True:
            events = dict(poller.poll(1000))
            if sock in events:
                kind, msg = P.read_control(back, sock.recv_multipart(copy=False))
                if kind == OUTPUT:
                    stdout.write(msg.get("data", ""))
                    stdout.flush()
                elif kind == DETACHED:
                    stdout.write(f"\n[rlmesh debug] {info['actor']} resumed\n")
                    stdout.flush()
                    return 0
            if stdin.fileno() in events:
                line = os.read(stdin.fileno(), 65536).decode("utf-8", "replace")
                if not line:  # end of input: let the actor go on
                    line = "continue\n"
                sock.send_multipart(P.control(auth, INPUT, data=line), copy=False)
            if not events and not alive():
                stdout.write(f"\n[rlmesh debug] {info['actor']}'s process is gone\n")
                return 1
    except KeyboardInterrupt:
        sock.send_multipart(P.control(auth, INPUT, data="continue\n"), copy=False)
        time.sleep(0.2)
        return 0
    finally:
        sock.close(500)


def debug_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rlmesh debug", description=__doc__.split("\n")[0])
    ap.add_argument("run", nargs="?", default="latest", help="run id, 'latest' (default) or run dir")
    ap.add_argument("--attach", metavar="ACTOR", help="actor id, mesh[rank] or proc id of a paused actor")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    a = ap.parse_args(argv)
    try:
        run_dir = runs.resolve_run(a.run)
    except Exception as exc:  # noqa: BLE001
        print(f"rlmesh debug: {exc}", file=sys.stderr)
        return 1
    service = runs.live_service(run_dir)
    if not service:
        print(f"rlmesh debug: run {run_dir.name} is not live (nothing can be paused in it)", file=sys.stderr)
        return 1
    entries = paused(run_dir)
    if not a.attach:
        if a.format == "json":
            print(json.dumps({"format_version": 1, "run": run_dir.name, "paused": entries}))
        elif not entries:
            print(f"no actor of run {run_dir.name} is paused (at a breakpoint() or post-mortem)")
        else:
            for e in entries:
                print(f"{e['actor']:<24} {e['mesh']}[{e['rank']}]  proc {e['proc']} on {e['host']} pid {e['pid']}  "
                      f"{e['function']} at {e['file']}:{e['line']}  paused {time.time() - e['since']:.0f}s  "
                      f"({e.get('reason', 'breakpoint()')})")
        return 0
    info = _pick(entries, a.attach)
    if info is None:
        known = ", ".join(e["actor"] for e in entries) or "none"
        print(f"rlmesh debug: no paused actor {a.attach!r} in run {run_dir.name} (paused: {known})", file=sys.stderr)
        return 1
    here = info["host"] == socket.gethostname()
    still_paused = None if here else (lambda: any(e["addr"] == info["addr"] for e in paused(run_dir)))
    return attach(info, bytes.fromhex(service["secret"]), alive=still_paused)
