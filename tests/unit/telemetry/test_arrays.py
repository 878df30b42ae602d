"""Arrow arrays built from buffers (rlmesh.telemetry.arrays) equal what ``pa.array`` builds, fall
back to it for anything not exactly of the column's type, and never import pandas (which every
pyarrow conversion of Python objects does, at 0.25 s and ~50 MB a proc)."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from rlmesh.telemetry import arrays
from rlmesh.telemetry.arrays import TS_TYPE

CASES = [
    (pa.int64(), [1, -2, None, 2**62, 0]),
    (pa.int64(), [None, None]),
    (pa.int64(), []),
    (pa.float64(), [1.5, None, -0.0, float("inf"), 1e-300]),
    (pa.bool_(), [True, False, None, True, True, False, True, False, True]),
    (pa.string(), ["a", "", None, "héllo ✓", "x" * 1000]),
    (pa.binary(), [b"\x00\xff", None, b""]),
    (TS_TYPE, [1_700_000_000_000_000, None]),
]


@pytest.mark.parametrize("type_,values", CASES)
def test_exact_values_build_the_array_pyarrow_would(type_, values):
    got = arrays.exact(values, type_)
    assert got is not None
    got.validate(full=True)
    want = pa.array(values, type=type_)
    assert got.type == want.type and got.equals(want), (got, want)
    assert got.null_count == values.count(None)


@pytest.mark.parametrize("type_,values", [
    (pa.int64(), [1, True]),          # a bool is not an int64 here: pyarrow decides
    (pa.int64(), [1, 2.0]),
    (pa.int64(), [2**70]),            # past int64: pyarrow's error
    (pa.float64(), [1.0, 2]),         # an int in a float column
    (pa.bool_(), [True, 1]),
    (pa.string(), ["a", 1]),
    (pa.string(), ["\ud800"]),        # a lone surrogate
    (pa.binary(), [bytearray(b"x")]),
])
def test_anything_not_exactly_the_type_is_left_to_pyarrow(type_, values):
    assert arrays.exact(values, type_) is None
    try:
        want = pa.array(values, type=type_)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        with pytest.raises(type(exc)):
            arrays.array(values, type_)
    else:
        assert arrays.array(values, type_).equals(want)


@pytest.mark.parametrize("values", [[1, None, 3], [0.5, None], [True, None], ["a", None], [b"a"],
                                    [1, 2.5], [None, None], [[1], [2]], [{"a": 1}], [1, "a"]])
def test_undeclared_columns_get_the_type_pyarrow_infers(values):
    try:
        want = pa.array(values)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            arrays.inferred(values)
        return
    got = arrays.inferred(values)
    assert got.type == want.type and got.equals(want), (got, want)


def test_repeat_and_timestamps():
    assert arrays.repeat("run-1", 3, pa.string()).equals(pa.array(["run-1"] * 3, type=pa.string()))
    assert arrays.repeat(7, 2, pa.int64()).equals(pa.array([7, 7], type=pa.int64()))
    assert arrays.repeat(None, 2, pa.string()).equals(pa.array([None, None], type=pa.string()))
    assert arrays.repeat(5, 2, TS_TYPE).equals(pa.array([5, 5], type=TS_TYPE))
    assert arrays.repeat(b"\x00", 2, pa.binary()).equals(pa.array([b"\x00"] * 2, type=pa.binary()))
    assert arrays.repeat("✓", 2, pa.string()).equals(pa.array(["✓"] * 2, type=pa.string()))
    with pytest.raises((pa.ArrowException, UnicodeEncodeError)):  # pyarrow's own refusal of a lone surrogate
        arrays.repeat("\ud800", 2, pa.string())
    us = np.array([1, 2_000_000], dtype=np.int64)
    assert arrays.timestamps(us).equals(pa.array(us, type=TS_TYPE))


def test_telemetry_rows_convert_without_importing_pandas():
    """The recorder's conversion of typical rows (every automatic column, declared and inferred
    typed columns, log lines) leaves pandas unimported; a fresh interpreter says so."""
    code = """
import sys
from rlmesh.telemetry.columnar import rows_to_arrow
rows = [(1.7e9 + i, ("gen", i % 2, f"gen.{i}", "h"), {"step": i, "loss": 0.5 * i, "ok": i % 2 == 0,
         "note": None if i else "first", "blob": b"x", "free": i * 2, "tag": "t"}) for i in range(50)]
table, tbl = rows_to_arrow("train", rows, "run-1", {"step": "BIGINT", "loss": "DOUBLE", "ok": "BOOLEAN",
                                                      "note": "VARCHAR", "blob": "BLOB"})
assert table == "train" and tbl.num_rows == 50, table
assert tbl.column("loss").to_pylist()[3] == 1.5 and tbl.column("proc").to_pylist()[7] == "gen.7"
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "converting telemetry rows imported pandas"
