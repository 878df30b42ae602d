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


def test_with_the_stores_write_marks_a_snapshot_visits_only_what_was_written(tmp_path):
    import pyarrow as pa

    from rlmesh.telemetry.store import Store

    store = Store(tmp_path / "t.duckdb", "r1")
    store.execute_write("INSERT INTO runs (run_id, id, status) VALUES ('r1', 'r1', 'running')")
    store.append("rollouts_x", pa.table({"i": [0, 1]}))
    store.append("spans_x", pa.table({"i": [0]}))
    snap = Snapshotter(store.con, tmp_path, interval=0, marks=store.write_marks)
    snap.root.mkdir()
    snap.snapshot()  # the first one looks at every table
    live = tmp_path / "live"
    runs_part = live / "runs" / "part-000000.parquet"
    runs_inode = runs_part.stat().st_ino
    assert _rows(live / "rollouts_x") == [0, 1] and _rows(live / "spans_x") == [0]

    def parts() -> dict[str, int]:
        return {d.name: len(list(d.glob("part-*.parquet"))) for d in live.iterdir() if d.is_symlink()}  # a link per table

    before = parts()
    snap.snapshot()  # nothing written since: nothing visited, nothing rewritten
    assert parts() == before and runs_part.stat().st_ino == runs_inode

    store.append("rollouts_x", pa.table({"i": [2]}))
    snap.snapshot()  # one table appended to: only it gains a part; runs is left as it was
    assert _rows(live / "rollouts_x") == [0, 1, 2]
    assert parts() == {**before, "rollouts_x": before["rollouts_x"] + 1}
    assert runs_part.stat().st_ino == runs_inode

    store.append("new_table", pa.table({"i": [7]}))  # a table created since the last snapshot
    store.execute_write("UPDATE runs SET status = 'ok'")  # not an append: every table is looked at again
    snap.snapshot()
    assert _rows(live / "new_table") == [7]
    assert runs_part.stat().st_ino != runs_inode
    assert pq.read_table(runs_part).column("status").to_pylist() == ["ok"]
    store.close()
