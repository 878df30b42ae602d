"""SIGKILL the controller mid-run: the file must open and hold every row recorded > 1 s before."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

HERE = Path(__file__).parent


@pytest.mark.timeout(60)
def test_sigkill_of_the_controller_loses_at_most_the_last_second(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID"))}
    env.update(RLMESH_RUNS_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, str(HERE / "scenario.py"), "durability"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("RECORDING"), p.stderr.read()
    run_id = line.split()[1]
    time.sleep(2.5)
    killed_at = time.time()
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    con = duckdb.connect(str(tmp_path / run_id / "telemetry.duckdb"), read_only=True)
    n, lo, hi, newest = con.execute("SELECT count(*), min(seq), max(seq), max(t) FROM ticks").fetchone()
    status = con.execute("SELECT status, end_ts FROM runs").fetchone()
    con.close()
    assert n > 500 and lo == 0 and hi == n - 1, (n, lo, hi)  # no holes: every older row is there
    assert newest >= killed_at - 1.0, f"newest row is {killed_at - newest:.2f}s older than the kill"
    assert status == ("running", None)  # the run never got to say it ended
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "runs", "--format", "json"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert '"status": "crashed"' in out.stdout, out.stdout + out.stderr


@pytest.mark.timeout(60)
def test_program_that_just_ends_keeps_the_procs_last_rows(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID"))}
    env.update(RLMESH_RUNS_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    # Seen once in a full suite run (5 Dec 2026), not reproduced in 340 runs at load up to 15: the
    # program aborted at exit (SIGABRT, "FATAL: exception not rethrown": a thread unwound by interpreter
    # finalization inside C++ code). faulthandler prints every thread's Python stack if it happens again.
    env["PYTHONFAULTHANDLER"] = "1"
    out = subprocess.run([sys.executable, str(HERE / "scenario.py"), "no_with"], env=env, capture_output=True,
                         text=True, timeout=50)
    assert out.returncode == 0, out.stderr[-3000:]
    run_id = out.stdout.split()[1]
    con = duckdb.connect(str(tmp_path / run_id / "telemetry.duckdb"), read_only=True)
    rows = con.execute("SELECT proc, count(*) FROM burst GROUP BY 1 ORDER BY 1").fetchall()
    stopped = con.execute("SELECT count(*) FROM actors WHERE event = 'stopped'").fetchone()[0]
    status = con.execute("SELECT status FROM runs").fetchone()[0]
    con.close()
    assert rows == [(f"procs.{i}", 1000) for i in range(3)]
    assert stopped == 3 and status == "ok"
