"""Parquet snapshots of a live run, called directly on a real DuckDB file: each table's new rows go
to a new part, ``runs`` is rewritten whole, and a second snapshot after more rows adds only those."""

import duckdb
import pyarrow.parquet as pq

from rlmesh.telemetry.snapshots import Snapshotter


def _rows(folder):
    return sorted(r for p in sorted(folder.glob("part-*.parquet")) for r in pq.read_table(p).column(0).to_pylist())


def test_snapshots_of_several_tables_hold_each_row_once(tmp_path):
    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    con.execute("CREATE TABLE rollouts (i BIGINT)")
    con.execute("CREATE TABLE spans (i BIGINT)")
    con.execute("CREATE TABLE runs (i BIGINT)")
    con.execute("INSERT INTO rollouts SELECT range FROM range(5)")
    con.execute("INSERT INTO spans SELECT range FROM range(3)")
    con.execute("INSERT INTO runs VALUES (1)")
    snap = Snapshotter(con, tmp_path, interval=0)
    snap.root.mkdir()  # what start() does, without its thread: the snapshots here are called directly
    snap.snapshot()  # several tables in one pass: each query leaves the shared cursor free for the next
    con.execute("INSERT INTO rollouts SELECT range FROM range(5, 8)")
    con.execute("UPDATE runs SET i = 2")
    snap.snapshot()
    live = tmp_path / "live"
    assert _rows(live / "rollouts") == list(range(8))
    assert len(list((live / "rollouts").glob("part-*.parquet"))) == 2
    assert _rows(live / "spans") == [0, 1, 2]
    assert _rows(live / "runs") == [2]
