"""Where runs live on disk and how a name (``latest``, an id, a path) finds one.

Layout, under ``RLMESH_RUNS_DIR`` (default ``./runs``)::

    runs/<run_id>/telemetry.duckdb   the data (DuckDB, WAL next to it while live)
    runs/<run_id>/run.json           id, status, start/end, pid: cheap for `rlmesh runs`
    runs/<run_id>/service.json       live service address + secret (mode 0600), removed at the end
    runs/latest -> <run_id>          the newest run (a relative symlink)
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from rlmesh import settings
from rlmesh.actor.pids import pid_exists
from rlmesh.files import write_atomically
from rlmesh.telemetry.errors import RunNotFoundError
from rlmesh.transport import is_loopback_address

logger = logging.getLogger(__name__)
RUNS_DIR_ENV = settings.RUNS_DIR.name
DB_NAME = "telemetry.duckdb"
RUN_JSON = "run.json"
SERVICE_JSON = "service.json"


def runs_dir() -> Path:
    """The runs directory: ``$RLMESH_RUNS_DIR`` or ``./runs``, resolved against the working directory."""
    return Path(settings.RUNS_DIR.get()).resolve()


def new_run_id() -> str:
    """Sortable by start time, unique across concurrent starts: ``20260102-153000-a1b2``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def create_run_dir(run_id: str, root: Path | None = None) -> Path:
    """Make ``runs/<run_id>/`` (mode 0700: it holds the job's secret while live) and point
    ``runs/latest`` at it (atomically). Settles runs of dead controllers first (:func:`settle_dead_runs`)."""
    root = root or runs_dir()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    settle_dead_runs(root)
    d = root / run_id
    d.mkdir(mode=0o700, exist_ok=False)
    _point_latest(root, run_id)
    return d


def _point_latest(root: Path, run_id: str) -> None:
    """``runs/latest`` -> ``run_id``, replaced atomically."""
    tmp = root / f".latest-{run_id}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(run_id)
        os.replace(tmp, root / "latest")
    except OSError:  # filesystems without symlinks: `latest` resolves by newest run.json
        tmp.unlink(missing_ok=True)


def reopen_run_dir(run_id: str, root: Path | None = None) -> Path:
    """An existing ``runs/<run_id>/`` to append to (a resumed run); ``runs/latest`` points at it again.

    Refuses a run whose controller is still alive (two writers on one database).
    """
    root = root or runs_dir()
    d = root / run_id
    if not (d / DB_NAME).exists():
        raise RunNotFoundError(f"cannot resume run {run_id!r}: no {d / DB_NAME}")
    info = read_json(d / RUN_JSON) or {}
    if run_status(info) == "running":
        raise RunNotFoundError(f"cannot resume run {run_id!r}: its controller (pid {info.get('pid')}) is still "
                               "running; stop it first")
    settle_dead_runs(root)
    d.chmod(0o700)
    _point_latest(root, run_id)
    return d


def settle_dead_runs(root: Path | None = None) -> list[str]:
    """Finish the bookkeeping of runs whose controller died on this host (SIGKILL, OOM, a kill
    during close): remove the stale ``service.json`` (it holds the secret), and make ``run.json``
    and the database's ``runs`` row agree: a status the database already holds (the controller
    got that far) wins; else both say ``crashed``. Called by ``rlmesh run``/``resume``/``runs``.
    A database another process holds (a resume starting) is left alone. Returns the ids settled."""
    root = root or runs_dir()
    settled: list[str] = []
    if not root.is_dir():
        return settled
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        info = read_json(d / RUN_JSON)
        svc = read_json(d / SERVICE_JSON)
        dead = [x for x in (info, svc) if x and x.get("host") == socket.gethostname()
                and not pid_alive(int(x.get("pid", -1)))]
        try:
            if svc and svc in dead:
                (d / SERVICE_JSON).unlink(missing_ok=True)
            if info and info in dead and info.get("status") == "running" and _settle(d, info):
                settled.append(d.name)
        except OSError as exc:  # a read-only or full runs folder: the run is listed as it is (crashed)
            logger.warning("run %s: its dead controller's records cannot be settled (%s); it is listed as "
                           "crashed: run `rlmesh clean` once that folder is writable", d.name, exc)
    return settled


def _settle(d: Path, info: dict[str, Any]) -> bool:
    import duckdb  # deferred: ~0.5 s to import, and every worker imports this module (workers never settle runs)

    from rlmesh.telemetry import durability  # deferred: as duckdb above

    durability.report(durability.check(d / DB_NAME))  # before the read-write open below folds the log in
    try:
        con = duckdb.connect(str(d / DB_NAME))
    except duckdb.Error:
        return False  # held by another process, or not readable: leave it for later
    try:
        row = con.execute("SELECT status, epoch(end_ts) FROM runs WHERE id = ?", [info.get("id", d.name)]).fetchall()
        status, end = (row[0] if row else ("running", None))
        if status == "running":
            status = "crashed"
            con.execute("UPDATE runs SET status = 'crashed' WHERE id = ?", [info.get("id", d.name)])
    except duckdb.Error:
        return False
    finally:
        con.close()
    write_json(d / RUN_JSON, dict(info, status=status, end_ts=end if end is not None else info.get("end_ts")))
    return True


def write_json(path: Path, data: dict[str, Any], private: bool = False) -> None:
    """Write atomically (rename), so readers never see half a file."""
    write_atomically(path, json.dumps(data, indent=1, default=str), private=private)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


pid_alive = pid_exists
"""True while a run's controller pid exists (:func:`rlmesh.actor.pids.pid_exists`)."""


def live_service(run_dir: Path) -> dict[str, Any] | None:
    """The service record of a run whose controller still runs, else ``None``.

    A record left behind by a killed controller is ignored (its pid is gone), so a
    crashed run is read straight from the file.
    """
    info = read_json(run_dir / SERVICE_JSON)
    if not info:
        return None
    if info.get("host") == socket.gethostname():
        if not pid_alive(int(info.get("pid", -1))):
            return None
    elif is_loopback(info.get("query_addr", "")):
        return None  # a live run on another host that only listens on its own loopback
    return info


def is_loopback(addr: str) -> bool:
    return bool(addr) and is_loopback_address(addr)


def run_status(info: dict[str, Any]) -> str:
    """``running``, ``ok``, ``failed`` or ``crashed`` (said to be running, but its controller is gone)."""
    status = info.get("status", "unknown")
    if status == "running" and info.get("host") == socket.gethostname():
        if not pid_alive(int(info.get("pid", -1))):
            return "crashed"
    return status


def list_runs(root: Path | None = None) -> list[dict[str, Any]]:
    """Every run under the runs directory, oldest first, with its derived status."""
    root = root or runs_dir()
    out: list[dict[str, Any]] = []
    if not root.is_dir():
        return out
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        info = read_json(d / RUN_JSON)
        if info is None:
            continue
        info = dict(info, status=run_status(info), path=str(d))
        out.append(info)
    return out


def resolve_db(spec: str | os.PathLike[str] | None = None) -> Path:
    """The DuckDB file of a run: ``None``/``"latest"``, a run id or a run directory (its
    ``telemetry.duckdb``), or any existing file path (a copy, another name: DuckDB decides if it is one)."""
    p = Path(os.fspath(spec)) if spec is not None else None
    if p is not None and p.is_file():
        return p.resolve()
    return resolve_run(spec) / DB_NAME


def db_label(db: Path) -> str:
    """How a file is named when several are queried together: its run id, or the file's stem."""
    return db.parent.name if db.name == DB_NAME else db.stem


def is_run_dir(d: Path) -> bool:
    """A run's folder: its database, or (the first ~0.3 s of a live run, while the service opens the
    database on its own thread) its ``run.json`` and ``service.json``."""
    return (d / DB_NAME).exists() or ((d / RUN_JSON).exists() and (d / SERVICE_JSON).exists())


def resolve_run(spec: str | os.PathLike[str] | None = None) -> Path:
    """Find a run directory from ``None``/``"latest"``, a run id, a run directory or a ``.duckdb`` path."""
    spec = "latest" if spec is None else os.fspath(spec)
    p = Path(spec)
    if p.suffix == ".duckdb" and p.is_file():
        return p.resolve().parent
    if is_run_dir(p):
        return p.resolve()
    root = runs_dir()
    if spec == "latest":
        link = root / "latest"
        if is_run_dir(link):
            return link.resolve()
        runs = list_runs(root)
        if runs:
            return Path(runs[-1]["path"])
    elif is_run_dir(root / spec):
        return (root / spec).resolve()
    known = [r["id"] for r in list_runs(root)][-5:]
    hint = f"recent runs: {', '.join(known)}" if known else f"no runs under {root} yet"
    raise RunNotFoundError(
        f"no telemetry run {spec!r} (looked for a run id under {root}, a run directory or a "
        f".duckdb file; set {RUNS_DIR_ENV} if your runs are elsewhere); {hint}"
    )
