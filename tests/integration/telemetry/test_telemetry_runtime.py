"""Telemetry with real procs and a real DuckDB file: the controller is a subprocess (scenario.py).

One scenario run serves the module: first the live checks (the controller is waiting
at READY, holding the file), then the finished-run checks (file opened read-only).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

HERE = Path(__file__).parent
pytestmark = pytest.mark.timeout(60)


def _env(runs_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID", "RLMESH_SECRET", "RLMESH_WORKER_PLUGINS"))}
    env["RLMESH_RUNS_DIR"] = str(runs_dir)
    env["RLMESH_HEALTH_INTERVAL"] = "0.2"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def live(runs_dir):
    p = subprocess.Popen([sys.executable, str(HERE / "scenario.py"), "full"], env=_env(runs_dir),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("READY"):
        p.kill()
        pytest.fail(f"scenario did not get ready: {line!r}\n{p.stderr.read()[-4000:]}")
    run_id = line.split()[1]
    yield p, runs_dir / run_id
    if p.poll() is None:
        p.kill()


@pytest.fixture(scope="module")
def finished(live):
    p, run_dir = live
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.wait(timeout=40) == 0, p.stderr.read()[-4000:]
    return run_dir


def sql(run, query: str, runs_dir: Path, fmt: str = "json") -> dict:
    """`rlmesh sql` as a separate process, the way a person or an agent would run it."""
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "sql", str(run), query, "--format", fmt],
                         env=_env(runs_dir), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if fmt == "json" else out.stdout


def poll(fn, timeout: float = 10.0):
    deadline = time.time() + timeout
    while True:
        got = fn()
        if got or time.time() > deadline:
            return got
        time.sleep(0.2)


# ---- while the run is live (the controller holds the file) -----------------------------

def test_live_query_from_another_process_goes_through_the_service(live, runs_dir):
    _, run_dir = live
    doc = sql(run_dir.name, "SELECT mesh, rank, count(*) AS n FROM rollouts WHERE mesh = 'recorder' "
              "GROUP BY ALL ORDER BY rank", runs_dir)
    ranks = {r["rank"]: r["n"] for r in doc["rows"]}
    assert set(ranks) == {0, 1, 2, 3}
    assert all(n >= 6 for n in ranks.values()), ranks  # 5 steps + step 100 (proc 3 again after restart)
    with pytest.raises(duckdb.IOException):  # the file really is locked: only the service can answer
        duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True)


def test_live_query_from_inside_an_actor(live, runs_dir):
    _, run_dir = live
    seen = sql(run_dir.name, "SELECT seen_by_worker AS n FROM scenario", runs_dir)["rows"][0]["n"]
    # steps 0-4 of every actor were shipped > 0.6 s before; step 100 of the others may still be in flight
    assert 4 * 5 <= seen <= 4 * 6 + 1


def test_schema_mismatch_in_an_actor_names_table_column_and_types(live, runs_dir):
    _, run_dir = live
    err = sql(run_dir.name, "SELECT schema_error FROM scenario", runs_dir)["rows"][0]["schema_error"]
    assert "'evals'" in err and "'score'" in err and "DOUBLE" in err and "VARCHAR" in err
    assert "recorded by recorder[1]" in err  # the actor (mesh and rank) whose row was refused
    rej = sql(run_dir.name, "SELECT row FROM _rejected WHERE table_name = 'evals'", runs_dir)["rows"]
    assert [json.loads(r["row"]) for r in rej] == [{"score": "high"}]


def test_cross_proc_mismatch_is_kept_in_rejected_not_dropped(live, runs_dir):
    _, run_dir = live
    kept = sql(run_dir.name, "SELECT proc, value FROM conflict", runs_dir)["rows"]
    assert kept == [{"proc": "procs.0", "value": 0}]
    rej = poll(lambda: sql(run_dir.name, "SELECT table_name, reason, row FROM _rejected WHERE table_name = 'conflict'",
                           runs_dir)["rows"])
    assert len(rej) == 3 and {r["table_name"] for r in rej} == {"conflict"}
    assert all("'value'" in r["reason"] and "BIGINT" in r["reason"] and "VARCHAR" in r["reason"] for r in rej)
    assert sorted(json.loads(r["row"])["value"] for r in rej) == ["rank1", "rank2", "rank3"]


def test_live_refusal_of_writes(live, runs_dir):
    _, run_dir = live
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "sql", run_dir.name, "DROP TABLE rollouts"],
                         env=_env(runs_dir), capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "read-only" in out.stderr and "DROP" in out.stderr
    # issue 11 item 3: EXPLAIN ANALYZE passed a statement-type check and wrote a file from the controller
    target = runs_dir / "leak.csv"
    for sql in (f"EXPLAIN ANALYZE COPY rollouts TO '{target}'", "EXPLAIN ANALYZE DELETE FROM rollouts"):
        out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "sql", run_dir.name, sql],
                             env=_env(runs_dir), capture_output=True, text=True, timeout=30)
        assert out.returncode == 1 and "read-only" in out.stderr, out.stderr
    assert not target.exists()


def test_live_runs_listing(live, runs_dir):
    _, run_dir = live
    doc = json.loads(subprocess.run([sys.executable, "-m", "rlmesh.cli", "runs", "--format", "json"],
                                    env=_env(runs_dir), capture_output=True, text=True, timeout=30).stdout)
    assert {r["id"]: r["status"] for r in doc["rows"]}[run_dir.name] == "running"


def test_live_host_health(live, runs_dir):
    _, run_dir = live
    rows = poll(lambda: sql(run_dir.name, "SELECT host, proc, count(*) AS n FROM host_health GROUP BY ALL",
                            runs_dir)["rows"])
    assert len(rows) == 1, rows  # one sampler per host, not one per proc
    assert rows[0]["proc"] == "controller" and rows[0]["n"] >= 2


# ---- after the run (file opened read-only) ------------------------------------------------

def q(run_dir: Path, query: str) -> list[dict]:
    con = duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True)
    try:
        cur = con.execute(query)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.close()


def test_rows_from_every_actor_carry_automatic_columns(finished):
    rows = q(finished, "SELECT run_id, mesh, rank, proc, host, ts, rollout_id FROM rollouts "
                       "WHERE mesh = 'recorder' ORDER BY rank")
    assert {r["run_id"] for r in rows} == {finished.name}
    assert {(r["rank"], r["proc"]) for r in rows} == {(i, f"procs.{i}") for i in range(4)}
    assert all(r["host"] and r["ts"] is not None for r in rows)
    ctl = q(finished, "SELECT mesh, rank, proc FROM rollouts WHERE rollout_id = 'from-controller'")
    assert ctl == [{"mesh": "controller", "rank": -1, "proc": "controller"}]


def test_death_and_restart_are_in_actors(finished):
    rows = q(finished, "SELECT event, incarnation, signal FROM actors WHERE proc = 'procs.3' ORDER BY ts")
    events = [(r["event"], r["incarnation"], r["signal"]) for r in rows]
    assert ("died", 0, 9) in events
    assert ("restarted", 1, None) in events
    assert events.index(("died", 0, 9)) < events.index(("restarted", 1, None))
    stopped = q(finished, "SELECT count(DISTINCT proc) AS n FROM actors WHERE event = 'stopped'")
    assert stopped == [{"n": 4}]


def test_spans_record_calls_and_errors(finished):
    rows = q(finished, "SELECT endpoint, outcome, error, rank, proc, sum(weight) AS calls, min(bytes_in) AS b "
                       "FROM spans GROUP BY ALL ORDER BY endpoint, rank")
    fail = [r for r in rows if r["endpoint"] == "fail"]
    assert len(fail) == 1 and fail[0]["outcome"] == "error" and "reward collapsed" in fail[0]["error"]
    assert fail[0]["rank"] == 2 and fail[0]["proc"] == "procs.2"
    steps = {r["rank"]: r["calls"] for r in rows if r["endpoint"] == "step"}
    assert steps[0] == 6 and all(b["b"] > 0 for b in rows)


def test_restart_joined_with_span_errors(finished):
    """The docs' join: which procs had errors, and had they been restarted?"""
    rows = q(finished, """
        SELECT a.proc, count(*) FILTER (WHERE a.event = 'restarted') AS restarts,
               (SELECT count(*) FROM spans s WHERE s.proc = a.proc AND s.outcome = 'error') AS errors
        FROM actors a GROUP BY a.proc ORDER BY a.proc""")
    by = {r["proc"]: r for r in rows}
    assert by["procs.3"]["restarts"] == 1 and by["procs.2"]["errors"] == 1 and by["procs.0"]["errors"] == 0


def test_run_row_is_finished_and_gpu_health_is_empty_without_gpu(finished):
    (run,) = q(finished, "SELECT status, end_ts IS NOT NULL AS ended FROM runs")
    assert run == {"status": "ok", "ended": True}
    from rlmesh.telemetry.gpu import GpuSampler

    if not GpuSampler().available:
        assert q(finished, "SELECT count(*) AS n FROM gpu_health") == [{"n": 0}]


def test_cli_on_finished_run_all_formats(finished, runs_dir, tmp_path):
    assert sql("latest", "SELECT count(*) AS n FROM spans", runs_dir)["rows"][0]["n"] > 0
    text = sql(finished.name, "SELECT event, proc FROM actors", runs_dir, fmt="table")
    assert "restarted" in text and "\x1b[" not in text
    csv_text = sql(finished, "SELECT event, proc FROM actors ORDER BY ts", runs_dir, fmt="csv")
    assert csv_text.splitlines()[0] == '"event","proc"'
    out = tmp_path / "a.parquet"
    r = subprocess.run([sys.executable, "-m", "rlmesh.cli", "sql", str(finished / "telemetry.duckdb"),
                        "SELECT * FROM actors", "--format", "parquet", "--out", str(out)],
                       env=_env(runs_dir), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(out).num_rows >= 10


def test_doc_queries_run_on_a_real_run(finished):
    import re

    doc = (HERE.parents[2] / "docs" / "telemetry.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", doc, flags=re.S)
    assert len(queries) >= 10
    for query in queries:
        q(finished, query)  # every snippet parses and runs against real tables
    deaths = q(finished, queries[2])
    assert [(r["proc"], r["signal"]) for r in deaths] == [("procs.3", 9)]
