import datetime as dt

import duckdb
import numpy as np
import pytest

from rlmesh.telemetry import schema


def test_every_builtin_table_creates_and_every_column_is_documented():
    con = duckdb.connect()
    for t in schema.BUILTIN.values():
        con.execute(schema.builtin_ddl(t))
        cols = [r[0] for r in con.execute(f"DESCRIBE {t.name}").fetchall()]
        assert cols[:2] == ["run_id", "ts"], t.name
        for c in cols:
            assert schema.describe_column(t.name, c), f"{t.name}.{c} has no description"
    expected = {"runs", "actors", "spans", "refusals", "rollouts", "rewards", "train_steps", "train_ranks", "weight_syncs", "evals",
                "samples", "host_health", "proc_health", "gpu_health", "work_items", "checkpoints", "logs", "stacks", "file_syncs", "phases", "turns",
                "debug_sessions"}
    assert set(schema.BUILTIN) == expected


@pytest.mark.parametrize("value,kind", [
    (1, "int"), (1.5, "float"), ("s", "str"), (True, "bool"), (None, "none"), (b"x", "bytes"),
    (dt.datetime.now(), "datetime"), ([1], "list"), ({"a": 1}, "dict"),
    (np.float32(1.5), "float"), (np.int64(3), "int"), (np.bool_(True), "bool"),
])
def test_kind_of(value, kind):
    assert schema.kind_of(value) == kind


def test_unsupported_kind_names_the_type():
    assert schema.kind_of(object()) == "unsupported:builtins.object"


def test_fits_allows_only_lossless():
    assert schema.fits("DOUBLE", "int")
    assert not schema.fits("BIGINT", "float")
    assert not schema.fits("BIGINT", "bool")
    assert not schema.fits("VARCHAR", "int")
    assert schema.fits("JSON", "dict")
    assert schema.fits("BIGINT", "none")


def test_schema_error_names_table_column_and_both_types():
    e = schema.SchemaError("rollouts", "reward", "DOUBLE", "VARCHAR")
    assert "rollouts" in str(e) and "reward" in str(e) and "DOUBLE" in str(e) and "VARCHAR" in str(e)
    assert isinstance(e, TypeError)
