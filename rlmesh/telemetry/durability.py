"""Committed rows are never lost silently: a record of what the service committed, checked at open.

Why: after a controller SIGKILL the rows since the last checkpoint live only in DuckDB's
write-ahead log (``telemetry.duckdb.wal``). DuckDB 2.0.1, given a log that was truncated, replays it
up to the tear and says nothing (measured: a log cut at 10 % of its length gave 2,000 of 20,000
rows, read-only or read-write, without a word); given one with a damaged entry, it refuses the
whole database ("Corrupt WAL file: entry at byte position N"). And the first read-write open
(a resume, ``rlmesh runs`` settling a crashed run) folds the log into the file and deletes it.

So the service keeps a sidecar, ``telemetry.duckdb.committed`` (JSON, 0600), rewritten after each
commit of its writer (a few times a second at most): the row count of every table it appends to.
:func:`check` compares it with what the database holds once the log is replayed. A database that
holds fewer rows than were committed gets one clear line (which tables, how many rows kept, where
the copy of the torn log is); the copy goes beside the file before anything can delete the log,
and the line is kept in the sidecar, so every later open says it again. A log DuckDB refuses is
copied aside, then cut at the damaged entry (:func:`repair`): the rows before it are kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from rlmesh.files import write_atomically

logger = logging.getLogger(__name__)

SUFFIX = ".committed"
_CORRUPT = re.compile(r"Corrupt WAL file: entry at byte position (\d+)")


_reported: set[str] = set()


def report(note: str | None) -> None:
    """Say ``note`` (a warning), once per process: a resume checks at settling and again at opening."""
    if note and note not in _reported:
        _reported.add(note)
        logger.warning("%s", note)


def sidecar(db: Path) -> Path:
    return db.with_name(db.name + SUFFIX)


def wal(db: Path) -> Path:
    return db.with_name(db.name + ".wal")


def read(db: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(sidecar(db).read_text())
    except (OSError, ValueError):
        return None  # none (a run from an older rlmesh, a copy of the file), or unreadable: nothing to check
    return data if isinstance(data, dict) and isinstance(data.get("rows"), dict) else None


def write(db: Path, rows: dict[str, int], note: str | None = None, clean: bool = False) -> None:
    """Atomically replace the sidecar (owner-only): a kill mid-write leaves the previous one."""
    write_atomically(sidecar(db), json.dumps({"rows": rows, "note": note, "clean": clean}), private=True)


def _copy_aside(db: Path) -> Path | None:
    """A copy of the log beside it (``telemetry.duckdb.wal.torn``, ``.torn-2``...), once per log."""
    src = wal(db)
    if not src.exists():
        return None
    data = src.read_bytes()
    for i in range(1, 100):
        dst = src.with_name(src.name + (".torn" if i == 1 else f".torn-{i}"))
        if dst.exists() and dst.read_bytes()[:len(data)] == data:
            return dst  # copied already (an earlier open; or before repair() cut the log at a damaged entry)
        if not dst.exists():
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o600)
            return dst
    return None


def repair(db: Path, exc: BaseException) -> bool:
    """DuckDB refused ``db`` for a damaged log entry: copy the log aside, cut it at that entry.
    True if it did (open again: the rows before the entry are replayed); False for any other error."""
    m = _CORRUPT.search(str(exc))
    log = wal(db)
    if m is None or not log.exists():
        return False
    at = int(m.group(1))
    copy = _copy_aside(db)
    if copy is None or at >= log.stat().st_size:
        return False
    os.truncate(log, at)
    logger.warning("telemetry: %s: DuckDB refused its write-ahead log (damaged entry at byte %d); the log is copied "
                   "to %s and cut there, so the rows before the damage are kept", db, at, copy)
    return True


def counts(con: Any, tables: list[str] | None = None, catalog: str | None = None) -> dict[str, int]:
    """Rows per table as ``con`` sees them (0 for a table the database does not have); ``None``: every table."""
    from rlmesh.telemetry.schema import qident  # deferred: light, but keeps this module's import plain

    where = f"{qident(catalog)}." if catalog else ""
    have = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_type = 'BASE TABLE'"
        + (" AND table_catalog = ?" if catalog else ""), [catalog] if catalog else []).fetchall()}
    out = {}
    for t in sorted(have) if tables is None else tables:
        out[t] = int(con.execute(f"SELECT count(*) FROM {where}{qident(t)}").fetchone()[0]) if t in have else 0
    return out


def check(db: Path, con: Any = None, catalog: str | None = None) -> str | None:
    """The one line that says ``db`` lost committed rows, or ``None``. ``con``: a connection that has
    ``db`` open (attached as ``catalog``); without one, ``db`` is opened read-only here (which replays
    the log and leaves it in place). Copies the torn log aside and keeps the line in the sidecar."""
    side = read(db)
    if side is None or side.get("clean"):
        return side.get("note") if side else None  # closed cleanly: every committed row is in the file
    if side.get("note"):
        return str(side["note"])
    committed = {str(t): int(n) for t, n in side["rows"].items()}
    if not committed:
        return None
    if con is None:
        import duckdb  # deferred: ~0.5 s to import; only a reader of a crashed run gets here

        try:
            own = duckdb.connect(str(db), read_only=True)
        except duckdb.Error as exc:
            if not repair(db, exc):
                return None  # held by a live writer, or not a database: the caller's open says why
            own = duckdb.connect(str(db), read_only=True)
        try:
            have = counts(own, list(committed))
        finally:
            own.close()
    else:
        have = counts(con, list(committed), catalog)
    short = {t: (have[t], n) for t, n in committed.items() if have[t] < n}
    if not short:
        return None
    log = wal(db)
    size = log.stat().st_size if log.exists() else None
    copy = _copy_aside(db)
    kept = ", ".join(f"{h} of {n} {t} rows" for t, (h, n) in sorted(short.items()))
    note = (f"telemetry: {db} holds fewer rows than its service committed: the write-ahead log "
            + (f"({log.name}, {size} bytes) " if size is not None else "")
            + f"did not replay whole (torn or truncated); kept {kept} (every row before the tear)"
            + (f"; the torn log is copied to {copy}" if copy else "; the log itself is gone"))
    try:
        write(db, committed, note=note)
    except OSError:
        pass  # a read-only runs directory: the line is still said, on every open
    return note
