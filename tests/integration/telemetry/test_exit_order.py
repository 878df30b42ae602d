"""A program that ends while the telemetry service is still loading DuckDB keeps every row.

Why this test: DuckDB registers an exit handler when it is imported, and once that handler has
run, DuckDB refuses every Arrow append from a thread other than the main one ("this query cannot
run Python code: the Python interpreter is shutting down"). The service imports DuckDB on its
opener thread and writes on its writer thread, so if DuckDB's handler ran before the run's own
exit handler (which drains the rows into the file), the whole run was lost: ``runs`` said ``ok``
with 0 rows (seen in a full suite run on 5 Dec 2026, in ``test_durability``). It happened when
the program reached its exit between DuckDB's import and the moment the run's handler was
registered again behind DuckDB's. This test holds the opener exactly there (the run's handler
registered first, DuckDB's next) and exits.
"""

import json
import os
import subprocess
import sys
import textwrap

import duckdb
import pytest

PROGRAM = textwrap.dedent("""
    import atexit, importlib.abc, importlib.machinery, sys, threading, time

    imported = threading.Event()
    exiting = threading.Event()  # set by the program's newest exit handler: the first to run at exit

    class HoldAfterDuckDB(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        '''Imports the real DuckDB (its exit handler is registered then), says so, and holds the
        importing thread (the service's opener) there until the program has begun to exit.'''
        def find_spec(self, name, path, target=None):
            if name != "duckdb" or threading.current_thread() is threading.main_thread():
                return None
            return importlib.machinery.ModuleSpec(name, self)
        def create_module(self, spec):
            sys.meta_path.remove(self)
            api = sys.modules["rlmesh.telemetry.api"]
            deadline = time.monotonic() + 30
            while not api._hooked and time.monotonic() < deadline:  # the run's exit handler is registered
                time.sleep(0.01)                                   # first, as when DuckDB loads slowly
            real = importlib.import_module("duckdb")
            imported.set()
            exiting.wait(60)
            return real
        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, HoldAfterDuckDB())
    import rlmesh as rm

    for i in range(100):
        rm.telemetry.record("early", i=i)  # the controller's rows: written by the service's writer thread
    run = rm.telemetry.current_run()
    assert imported.wait(60)
    atexit.register(exiting.set)  # newer than DuckDB's handler: the exit starts while the opener is held
    print("EXITING", run, flush=True)  # the program ends in the window
""")


@pytest.mark.timeout(120)
def test_rows_survive_an_exit_right_after_duckdb_is_imported(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID"))}
    env.update(RLMESH_RUNS_DIR=str(tmp_path), PYTHONFAULTHANDLER="1")
    env.pop("RLMESH_SECRET", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    run_id = out.stdout.split()[1]
    con = duckdb.connect(str(tmp_path / run_id / "telemetry.duckdb"), read_only=True)
    try:
        status = con.execute("SELECT status FROM runs").fetchone()[0]
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        rows = con.execute("SELECT count(*), min(i), max(i) FROM early").fetchone() if "early" in tables else None
    finally:
        con.close()
    assert status == "ok"
    assert rows == (100, 0, 99), (rows, out.stderr[-3000:])
    assert json.loads((tmp_path / run_id / "run.json").read_text())["rows"] >= 100
