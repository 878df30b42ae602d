import duckdb
import pyarrow as pa
import pytest

from rlmesh.telemetry.columnar import TS_TYPE
from rlmesh.telemetry.errors import ReadOnlyQueryError
from rlmesh.telemetry.schema import SchemaError
from rlmesh.telemetry.store import Store, statements


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "t.duckdb", "run-1")
    yield s
    s.close()


def _auto(n):
    return {"run_id": ["run-1"] * n, "ts": pa.array([1_700_000_000_000_000] * n, type=TS_TYPE)}


def test_builtin_tables_exist_empty(store):
    tables = {r["name"] for r in store.query("SELECT table_name AS name FROM information_schema.tables").to_pylist()}
    assert {"runs", "actors", "spans", "rollouts", "rewards", "train_steps", "weight_syncs",
            "host_health", "gpu_health", "_rejected"} <= tables
    assert store.query("SELECT count(*) AS n FROM gpu_health").to_pylist() == [{"n": 0}]


def test_append_by_name_any_column_order(store):
    store.append("rollouts", pa.table({"reward": [1.0, 2.0], **_auto(2), "policy_version": [3, 4]}))
    assert store.query("SELECT policy_version, reward FROM rollouts ORDER BY 1").to_pylist() == [
        {"policy_version": 3, "reward": 1.0}, {"policy_version": 4, "reward": 2.0}]


def test_user_table_created_then_evolves_then_refuses_mismatch(store):
    store.append("mine", pa.table({**_auto(1), "a": [1], "b": ["x"]}))
    store.append("mine", pa.table({**_auto(1), "a": [2], "c": [0.5]}))  # added column
    with pytest.raises(SchemaError) as ei:
        store.append("mine", pa.table({**_auto(1), "a": ["oops"]}))
    assert "'mine'" in str(ei.value) and "'a'" in str(ei.value)
    assert "BIGINT" in str(ei.value) and "VARCHAR" in str(ei.value)
    assert store.query("SELECT a, b, c FROM mine ORDER BY a").to_pylist() == [
        {"a": 1, "b": "x", "c": None}, {"a": 2, "b": None, "c": 0.5}]
    rej = store.query("SELECT table_name, reason, row FROM _rejected").to_pylist()
    assert len(rej) == 1 and rej[0]["table_name"] == "mine" and '"oops"' in rej[0]["row"]


def test_int_batch_into_double_column_is_widened(store):
    store.append("rollouts", pa.table({**_auto(1), "reward": [3]}))
    assert store.query("SELECT reward FROM rollouts").to_pylist() == [{"reward": 3.0}]


def test_all_null_column_waits_for_a_typed_value(store):
    store.append("mine2", pa.table({**_auto(1), "a": [1], "z": pa.array([None], type=pa.null())}))
    store.append("mine2", pa.table({**_auto(1), "a": [2], "z": ["now typed"]}))
    assert store.query("SELECT z FROM mine2 ORDER BY a").to_pylist() == [{"z": None}, {"z": "now typed"}]


@pytest.mark.parametrize("sql", [
    "DROP TABLE rollouts", "DELETE FROM rollouts", "INSERT INTO rollouts (reward) VALUES (1)",
    "UPDATE runs SET status = 'x'", "CREATE TABLE x (a INT)", "COPY rollouts TO '/tmp/x.csv'",
    "ATTACH '/tmp/other.duckdb'", "PRAGMA force_checkpoint", "SET threads = 1",
    "SELECT 1; DROP TABLE rollouts", "ALTER TABLE runs ADD COLUMN x INT",
    # shapes a statement-type allowlist let through (issue 11 item 3): the database refuses them itself
    "EXPLAIN ANALYZE COPY rollouts TO '{out}'", "EXPLAIN ANALYZE DELETE FROM rollouts",
    "COMMIT; DELETE FROM rollouts", "ROLLBACK; DROP TABLE rollouts", "SELECT * FROM read_csv('{out}')",
    "EXPLAIN ANALYZE SELECT * FROM read_text('/etc/hostname')", "SET enable_external_access = true",
    "EXPORT DATABASE '{out}'", "INSTALL httpfs",
])
def test_writes_are_refused_with_a_clear_message(store, sql, tmp_path):
    out = tmp_path / "x.csv"
    store.append("rollouts", pa.table({**_auto(1), "reward": [1.0]}))
    with pytest.raises(ReadOnlyQueryError, match="read-only"):
        store.query(sql.format(out=out))
    assert not out.exists()
    assert store.query("SELECT count(*) AS n FROM rollouts").to_pylist() == [{"n": 1}]  # rows still there


@pytest.mark.parametrize("sql", [
    "SELECT 1", "WITH a AS (SELECT 1 AS x) SELECT * FROM a", "DESCRIBE rollouts", "SHOW TABLES",
    "SUMMARIZE rollouts", "EXPLAIN SELECT * FROM rollouts",
])
def test_reads_are_allowed(store, sql):
    store.query(sql)


def test_sql_errors_are_duckdb_errors():
    with pytest.raises(duckdb.Error):
        statements("SELEC nonsense")


def test_odd_names_are_quoted_not_injected(store):
    evil = 'x"; DROP TABLE runs; --'
    store.append(evil, pa.table({**_auto(1), "rollout/reward": [1.0], 'q"uote': [2]}))
    got = store.query('SELECT "rollout/reward" AS r, "q""uote" AS q FROM "x""; DROP TABLE runs; --"').to_pylist()
    assert got == [{"r": 1.0, "q": 2}]
    assert store.query("SELECT count(*) AS n FROM runs").num_rows == 1


def test_run_files_are_written_in_a_storage_version_duckdb_1_1_reads(tmp_path):
    """DuckDB 1.1.x reads storage version 64 and refuses 999 (what DuckDB 2.x writes by default)."""
    import struct

    from rlmesh.telemetry.store import Store

    s = Store(tmp_path / "telemetry.duckdb", "r")
    s.close()
    head = (tmp_path / "telemetry.duckdb").read_bytes()[:20]
    assert head[8:12] == b"DUCK" and struct.unpack("<Q", head[12:20])[0] == 64


def test_train_metrics_view_gives_the_common_metrics_columns(tmp_path):
    from rlmesh.telemetry.store import Store

    s = Store(tmp_path / "telemetry.duckdb", "r")
    s.execute_write("INSERT INTO train_steps (run_id, ts, step, loss, samples, duration_s, metrics) VALUES "
                    "('r', now(), 3, 0.5, 64, 0.5, '{\"losses/approx_kl\": 0.01, \"losses/entropy\": 1.25}')")
    row = s.query("SELECT step, approx_kl, entropy, kl, samples_per_s FROM train_metrics").to_pylist()
    s.close()
    assert row == [{"step": 3, "approx_kl": 0.01, "entropy": 1.25, "kl": None, "samples_per_s": 128.0}]
