"""The controller-side API in one process: implicit run, read-your-writes, end of run, read-only file."""

import json
import os

import duckdb
import pytest

import rlmesh.telemetry as tm
from rlmesh.telemetry import api
from rlmesh.telemetry import run as runs


def test_first_record_starts_a_run_and_query_sees_it(runs_dir):
    assert tm.current_run() is None
    tm.record("rollouts", reward=0.5, policy_version=1, rollout_id="a")
    tm.record("rollouts", reward=1.5, policy_version=2, rollout_id="b")
    run_id = tm.current_run()
    assert run_id and (runs_dir / run_id / "run.json").exists()  # the database opens on the service's thread
    assert os.readlink(runs_dir / "latest") == run_id
    assert runs.resolve_run(run_id) == runs.resolve_run("latest") == (runs_dir / run_id).resolve()  # found at once
    rows = tm.query("SELECT policy_version, reward, mesh, rank, proc FROM rollouts ORDER BY 1").to_pylist()
    assert (runs_dir / run_id / "telemetry.duckdb").exists()
    assert rows == [
        {"policy_version": 1, "reward": 0.5, "mesh": "controller", "rank": -1, "proc": "controller"},
        {"policy_version": 2, "reward": 1.5, "mesh": "controller", "rank": -1, "proc": "controller"},
    ]
    assert tm.query("SELECT status FROM runs").to_pylist() == [{"status": "running"}]


def test_after_end_the_file_opens_read_only_and_status_is_ok(runs_dir):
    tm.start_run(config={"lr": 3e-4, "algo": "ppo"})
    tm.record("train_steps", step=1, loss=0.25)
    run_id = tm.current_run()
    tm.end_run()
    assert tm.current_run() is None
    db = runs_dir / run_id / "telemetry.duckdb"
    con = duckdb.connect(str(db), read_only=True)  # the lock is released
    row = con.execute("SELECT status, end_ts IS NOT NULL, config FROM runs").fetchone()
    con.close()
    assert row[:2] == ("ok", True) and json.loads(row[2]) == {"lr": 3e-4, "algo": "ppo"}
    assert tm.query("SELECT loss FROM train_steps", run=run_id).to_pylist() == [{"loss": 0.25}]
    assert tm.query("SELECT loss FROM train_steps").to_pylist() == [{"loss": 0.25}]  # latest
    assert not (runs_dir / run_id / runs.SERVICE_JSON).exists()
    assert json.loads((runs_dir / run_id / runs.RUN_JSON).read_text())["status"] == "ok"


def test_query_refuses_writes_live_and_after(runs_dir):
    tm.record("mine", a=1)
    with pytest.raises(tm.ReadOnlyQueryError, match="DROP statement was refused"):
        tm.query("DROP TABLE mine")
    run_id = tm.current_run()
    tm.end_run()
    with pytest.raises(tm.ReadOnlyQueryError, match="DELETE statement was refused"):
        tm.query("DELETE FROM mine", run=run_id)
    assert tm.query("SELECT a FROM mine", run=run_id).to_pylist() == [{"a": 1}]


def test_explain_analyze_cannot_write_live_or_after(runs_dir, tmp_path):
    """Issue 11 item 3: the statement-type allowlist let EXPLAIN ANALYZE COPY write a file from the controller."""
    out = tmp_path / "x.csv"
    tm.record("mine", a=1)
    for _ in range(2):  # live (the service's connection), then after the run (the file)
        with pytest.raises(tm.ReadOnlyQueryError, match="read-only"):
            tm.query(f"EXPLAIN ANALYZE COPY mine TO '{out}'", run=tm.current_run() or "latest")
        with pytest.raises(tm.ReadOnlyQueryError, match="read-only"):
            tm.query("EXPLAIN ANALYZE DELETE FROM mine", run=tm.current_run() or "latest")
        assert not out.exists()
        assert tm.query("SELECT a FROM mine", run=tm.current_run() or "latest").to_pylist() == [{"a": 1}]
        tm.end_run()


def test_schema_mismatch_is_raised_by_flush_and_the_row_kept_in_rejected(runs_dir):
    tm.record("mine", loss=0.5)
    tm.record("mine", loss="nan")
    tm.record("mine", loss=1.5)
    with pytest.raises(tm.SchemaError) as ei:
        tm.flush()
    assert "mine" in str(ei.value) and "loss" in str(ei.value) and "DOUBLE" in str(ei.value)
    assert "recorded by controller" in str(ei.value)
    tm.flush()  # raised once
    assert tm.query("SELECT loss FROM mine ORDER BY loss").column("loss").to_pylist() == [0.5, 1.5]
    rej = tm.query("SELECT table_name, row FROM _rejected").to_pylist()
    assert rej == [{"table_name": "mine", "row": '{"loss": "nan"}'}]


def test_tables_lists_builtin_and_user_columns_with_meaning(runs_dir):
    tm.record("mine", a=1)
    t = tm.tables().to_pylist()
    by = {(r["table"], r["column"]): r for r in t}
    assert by[("gpu_health", "temp_c")]["description"].startswith("core temperature")
    assert by[("mine", "a")]["type"] == "BIGINT"
    assert by[("mine", "host")]["description"]


def test_record_batch_and_flush(runs_dir):
    tm.record_batch("rollouts", {"reward": [1.0, 2.0, 3.0], "policy_version": [1, 2, 2]})
    tm.flush()
    assert tm.query("SELECT policy_version, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1").to_pylist() == [
        {"policy_version": 1, "n": 1}, {"policy_version": 2, "n": 2}]


def test_host_health_rows_appear(runs_dir):
    import time

    tm.record("mine", a=1)
    deadline = time.time() + 10
    while time.time() < deadline:
        rows = tm.query("SELECT cpu_pct, mem_total, mem_available, rss, load_1m FROM host_health").to_pylist()
        if rows:
            break
        time.sleep(0.1)
    assert rows, "no host_health rows within 10 s"
    r = rows[0]
    assert r["mem_total"] > r["mem_available"] > 0 and r["rss"] > 0 and 0 <= r["cpu_pct"] <= 100


def test_telemetry_off(runs_dir, monkeypatch):
    monkeypatch.setenv("RLMESH_TELEMETRY", "0")
    tm.record("mine", a=1)
    tm.set_config({"lr": 1})
    assert tm.start_run() is None
    assert tm.current_run() is None and not runs_dir.exists()


def test_dataclass_config_is_stored_as_json(runs_dir):
    import dataclasses

    @dataclasses.dataclass
    class Cfg:
        lr: float = 3e-4
        algo: str = "grpo"

    tm.start_run(config=Cfg())
    assert json.loads(tm.query("SELECT config FROM runs").column("config")[0].as_py()) == {"lr": 3e-4, "algo": "grpo"}


def test_worker_env_names_the_service(runs_dir):
    env = api.worker_env()
    assert env["RLMESH_RUN_ID"] == tm.current_run()
    assert env["RLMESH_TELEMETRY_ADDR"].startswith("tcp://127.0.0.1:")


def test_proc_events_after_the_run_ended_start_no_phantom_run(runs_dir):
    """Issue 11 item 15: procs still stopping/respawning after a failed run's end_run created a new
    run (status ok) and moved runs/latest to it."""
    import socket

    from rlmesh.actor.hooks import ProcEvent
    from rlmesh.telemetry.plugin import record_proc_event

    tm.record("mine", a=1)
    run_id = tm.current_run()
    tm.end_run("failed", "RunFailed: trainer gave up")
    record_proc_event(ProcEvent("restarted", "rl", 1, "rl.1", 123, socket.gethostname(), 1))
    record_proc_event(ProcEvent("stopped", "rl", 1, "rl.1", 123, socket.gethostname(), 1))
    assert tm.current_run() is None
    assert [p.name for p in runs_dir.iterdir() if p.name != "latest"] == [run_id]
    assert os.readlink(runs_dir / "latest") == run_id
    info = json.loads((runs_dir / run_id / runs.RUN_JSON).read_text())
    assert info["status"] == "failed" and info["error"] == "RunFailed: trainer gave up"
    assert tm.query("SELECT status, error FROM runs", run=run_id).to_pylist() == [
        {"status": "failed", "error": "RunFailed: trainer gave up"}]


def test_run_files_are_private_and_the_service_record_goes(runs_dir):
    import stat

    tm.record("mine", a=1)
    tm.flush()
    d = api.current_run_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / runs.SERVICE_JSON).stat().st_mode) == 0o600
    for f in d.glob("telemetry.duckdb*"):  # the database and its WAL
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    tm.end_run()
    assert not (d / runs.SERVICE_JSON).exists()
    assert stat.S_IMODE((d / runs.DB_NAME).stat().st_mode) == 0o600
