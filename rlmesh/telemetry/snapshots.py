"""Parquet snapshots of a live run, for readers that cannot open the locked DuckDB file (pandas, polars, Spark).

While a run is live its DuckDB file is locked by the telemetry service, so any other
``duckdb.connect`` (and everything built on it) fails with "Conflicting lock". Every
``RLMESH_SNAPSHOT_S`` seconds (default 5; 0 = off) the service writes each table's new rows
as a Parquet part::

    runs/<run>/live/<table>/part-000001.parquet, part-000002.parquet, ...

so ``pd.read_parquet("runs/latest/live/rollouts")`` or
``pl.read_parquet("runs/latest/live/rollouts/*.parquet")`` read a table as of the last
snapshot. Why snapshots rather than Arrow Flight SQL: every dataframe library reads a
Parquet folder with no extra client, driver or port, the cost is one incremental ``COPY``
per table per interval on the service (measured in ``benchmarks/observe.py``), and nothing
new listens on the network.

Rules that keep readers safe: a part is written under a dot-name and renamed into place
(readers skip dot-files); each part holds the rows whose ``rowid`` (DuckDB keeps insertion order) is past the previous part, so it holds only rows
not in earlier parts; a table with more than ``MAX_PARTS`` parts is compacted into a fresh
folder (``<table>.g<N>``) and ``live/<table>`` (a symlink) is switched to it atomically; the
old folder goes a minute later. ``runs`` is rewritten whole (its row is updated). The
``live/`` folder is removed when the run ends: then the file itself is readable.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

from rlmesh import settings
from rlmesh.telemetry.schema import qident

logger = logging.getLogger(__name__)

SNAPSHOT_ENV = settings.SNAPSHOT_S.name
LIVE_DIR = "live"
MAX_PARTS = 64
OLD_GEN_GRACE_S = 60.0
WHOLE = ("runs",)  # tables whose rows change in place


def interval_from_env() -> float:
    """Seconds between snapshots (``RLMESH_SNAPSHOT_S``); 0 = off."""
    return settings.SNAPSHOT_S.get()


def _dirname(table: str) -> str:
    return urllib.parse.quote(table, safe="")  # user tables may be named eval/gsm8k


class _TableState:
    def __init__(self) -> None:
        self.next_rowid = 0
        self.parts = 0
        self.gen = 0
        self.seq = 0


class Snapshotter:
    """Runs on its own thread in the service; reads through a cursor of the service's connection."""

    def __init__(self, con: Any, run_dir: Path, interval: float, marks: Callable[[], Any] | None = None):
        """``marks``: the store's :meth:`~rlmesh.telemetry.store.Store.write_marks`; with it, a snapshot
        visits only the tables written since the last one (none at all when nothing was written), instead
        of listing every table and asking each for its top rowid: an idle run wrote nothing but its
        health rows, yet paid ~20 ms of queries and a rewrite of ``runs`` every interval."""
        self.con = con
        self._marks = marks
        self._seen: Any = None  # the marks as of the last snapshot that finished
        self.root = Path(run_dir) / LIVE_DIR
        self.interval = interval
        self._state: dict[str, _TableState] = {}
        self._old: list[tuple[float, Path]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlmesh-telemetry-snapshot", daemon=True)
        self.last_s = 0.0  # duration of the last snapshot (benchmarks read it)

    def start(self) -> "Snapshotter":
        self.root.mkdir(exist_ok=True)
        self._thread.start()
        return self

    def stop(self, remove: bool = True) -> None:
        self._stop.set()
        self._thread.join(10)
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.snapshot()
            except Exception:  # noqa: BLE001 - the next interval tries again
                logger.exception("telemetry: Parquet snapshot failed")

    def snapshot(self) -> None:
        """Write every table's rows added since the last snapshot."""
        t0 = time.perf_counter()
        marks = self._marks() if self._marks is not None else None  # before reading: later writes move it
        seen = self._seen
        if marks is None or seen is None or marks.other != seen.other:
            tables = None  # first snapshot, or a write that may touch any table: look at all of them
        else:
            tables = [t for t, n in marks.appends.items() if seen.appends.get(t) != n and not t.startswith("_")]
        if tables != []:
            cur = self.con.cursor()
            try:
                if tables is None:
                    tables = [r[0] for r in cur.execute(
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                        "AND table_type = 'BASE TABLE' AND NOT starts_with(table_name, '_')").fetchall()]
                for t in tables:
                    self._table(cur, t)
            finally:
                cur.close()
        self._seen = marks  # only once every table it named is written (a failure looks again next time)
        now = time.monotonic()
        for when, path in [o for o in self._old if now - o[0] > OLD_GEN_GRACE_S]:
            shutil.rmtree(path, ignore_errors=True)
        self._old = [o for o in self._old if now - o[0] <= OLD_GEN_GRACE_S]
        self.last_s = time.perf_counter() - t0

    def _table(self, cur: Any, table: str) -> None:
        st = self._state.setdefault(table, _TableState())
        q = qident(table)
        # fetched to its end (not fetchone): DuckDB refuses the .sql() below on a cursor with a result open
        top = cur.execute(f"SELECT coalesce(max(rowid) + 1, 0) FROM {q}").fetchall()[0][0]
        if table in WHOLE:
            if top:
                self._write(cur, table, st, f"SELECT * FROM {q}", replace=True)
            return
        if top <= st.next_rowid:
            return
        if st.parts >= MAX_PARTS:  # compact: everything so far into a fresh folder, switched atomically
            st.gen += 1
            st.parts = 0
            self._write(cur, table, st, f"SELECT * FROM {q} WHERE rowid < {top}", new_gen=True)
        else:
            self._write(cur, table, st, f"SELECT * FROM {q} WHERE rowid >= {st.next_rowid} AND rowid < {top}")
        st.next_rowid = top

    def _write(self, cur: Any, table: str, st: _TableState, select: str, replace: bool = False,
               new_gen: bool = False) -> None:
        link = self.root / _dirname(table)
        gen_dir = self.root / f"{_dirname(table)}.g{st.gen}"
        if new_gen or not gen_dir.exists():
            gen_dir.mkdir(exist_ok=True)
        st.seq += 1
        name = "part-000000.parquet" if replace else f"part-{st.seq:06d}.parquet"
        tmp = gen_dir / f".{name}.tmp"
        # Written by pyarrow, not DuckDB's COPY: the writer's connection is locked down
        # (enable_external_access=false, docs/telemetry.md "Read-only"), so it cannot touch files.
        rows = cur.sql(select).to_arrow_table()  # a relation, not a DB-API result: no extra copy of the rows
        pq.write_table(rows, tmp)
        os.replace(tmp, gen_dir / name)
        st.parts += 1
        if not link.is_symlink() or os.readlink(link) != gen_dir.name:
            tmp_link = self.root / f".{_dirname(table)}.link"
            tmp_link.unlink(missing_ok=True)
            tmp_link.symlink_to(gen_dir.name)
            old = link.resolve() if link.is_symlink() else None
            os.replace(tmp_link, link)
            if old is not None and old != gen_dir.resolve():
                self._old.append((time.monotonic(), old))
