"""`rlmesh sql` / `rlmesh runs` on a finished run, every output format."""

import csv
import io
import json

import pyarrow.parquet as pq
import pytest

import rlmesh.telemetry as tm
from rlmesh.telemetry.cli import runs_main, sql_main


@pytest.fixture
def finished_run(runs_dir):
    for i in range(3):
        tm.record("rollouts", reward=float(i), policy_version=i, rollout_id=f"r{i}")
    tm.record("mine", tags=["a", "b"], meta={"k": 1})
    run_id = tm.current_run()
    tm.end_run()
    return run_id


Q = "SELECT policy_version, reward, ts FROM rollouts ORDER BY 1"


def test_table_format_is_plain_text_when_piped(finished_run, capsys):
    assert sql_main([Q]) == 0
    out = capsys.readouterr().out
    assert "policy_version" in out and "(3 rows)" in out and "\x1b[" not in out


def test_json_format_is_stable_and_ansi_free(finished_run, capsys):
    assert sql_main([finished_run, Q, "--format", "json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert "\x1b[" not in out
    assert doc["run"] == finished_run and doc["row_count"] == 3
    assert [c["name"] for c in doc["columns"]] == ["policy_version", "reward", "ts"]
    assert doc["rows"][1]["reward"] == 1.0 and doc["rows"][1]["ts"].endswith("+00:00")


def test_csv_format_with_nested_values(finished_run, capsys):
    assert sql_main(["SELECT tags, meta FROM mine", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert json.loads(rows[0]["tags"]) == ["a", "b"] and json.loads(rows[0]["meta"]) == {"k": 1}


def test_parquet_to_file(finished_run, tmp_path):
    out = tmp_path / "r.parquet"
    assert sql_main([Q, "--format", "parquet", "--out", str(out)]) == 0
    assert pq.read_table(out).column("reward").to_pylist() == [0.0, 1.0, 2.0]


def test_out_file_json(finished_run, tmp_path):
    out = tmp_path / "r.json"
    assert sql_main([Q, "--format", "json", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["row_count"] == 3


def test_schema_lists_tables_with_meaning(finished_run, capsys):
    assert sql_main([finished_run, "--schema", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cols = {c["name"]: c for c in doc["tables"]["actors"]["columns"]}
    assert "signal" in cols and "SIGKILL" in cols["signal"]["description"]
    assert doc["tables"]["mine"]["doc"] == "user table"
    assert sql_main(["--schema"]) == 0
    assert "gpu_health" in capsys.readouterr().out


def test_refusal_and_errors_exit_1_on_stderr(finished_run, capsys):
    assert sql_main(["DROP TABLE rollouts"]) == 1
    assert "read-only" in capsys.readouterr().err
    assert sql_main(["no-such-run", "SELECT 1"]) == 1
    assert "no telemetry run 'no-such-run'" in capsys.readouterr().err
    assert sql_main(["SELECT * FROM nope"]) == 1
    assert "nope" in capsys.readouterr().err


def test_runs_lists_status(finished_run, capsys):
    assert runs_main(["--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["status"]) for r in doc["rows"]] == [(finished_run, "ok")]


def test_any_duckdb_file_path_is_accepted(finished_run, runs_dir, tmp_path, capsys):
    copy = tmp_path / "some" / "copy.duckdb"  # issue 11 item 14: not named telemetry.duckdb
    copy.parent.mkdir()
    copy.write_bytes((runs_dir / finished_run / "telemetry.duckdb").read_bytes())
    assert sql_main([str(copy), "SELECT count(*) AS n FROM rollouts", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == [{"n": 3}]


def test_a_corrupt_file_says_so_without_the_other_host_hint(tmp_path, capsys):
    bad = tmp_path / "broken.duckdb"
    bad.write_bytes(b"not a database" * 100)
    assert sql_main([str(bad), "SELECT 1"]) == 1
    err = capsys.readouterr().err
    assert "not a valid DuckDB database" in err and "another host" not in err


def test_finished_runs_side_by_side(finished_run, runs_dir, capsys):
    tm.record("rollouts", reward=9.0, policy_version=9, rollout_id="x")
    second = tm.current_run()
    tm.end_run()
    q = (f'SELECT (SELECT count(*) FROM "{finished_run}".rollouts) AS a, '
         f'(SELECT count(*) FROM "{second}".rollouts) AS b, (SELECT count(*) FROM rollouts) AS default_')
    assert sql_main([finished_run, "--with", second, q, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == [{"a": 3, "b": 1, "default_": 3}]
    assert tm.query(q, run=[finished_run, second]).to_pylist() == [{"a": 3, "b": 1, "default_": 3}]
    # the attached files are the only ones: nothing else can be attached or read through SQL
    assert sql_main([finished_run, "--with", second, f"ATTACH '{runs_dir}/x.duckdb' AS x"]) == 1
    assert "read-only" in capsys.readouterr().err and not (runs_dir / "x.duckdb").exists()


def test_one_naming_of_types_in_results_and_schema():
    import pyarrow as pa

    from rlmesh.telemetry.cli import to_json, type_name

    tbl = pa.table({"a": pa.array([1]), "b": pa.array(["x"]), "c": pa.array([1.5]), "d": pa.array([True]),
                    "t": pa.array([0], type=pa.timestamp("us", tz="UTC")), "l": pa.array([[1, 2]])})
    doc = json.loads(to_json(tbl, "r"))
    assert doc["format_version"] == 1
    assert [c["type"] for c in doc["columns"]] == ["BIGINT", "VARCHAR", "DOUBLE", "BOOLEAN", "TIMESTAMPTZ", "BIGINT[]"]
    assert type_name("TIMESTAMP WITH TIME ZONE") == "TIMESTAMPTZ" and type_name("varchar") == "VARCHAR"
