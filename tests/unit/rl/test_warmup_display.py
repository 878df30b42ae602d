"""The warm-up display over `phases` rows (a real in-memory DuckDB with the table's declared schema)."""

import io
import threading
import time

import duckdb
import pytest

from rlmesh.rl.run.warmup import WarmupDisplay, phase_status
from rlmesh.telemetry import schema


@pytest.fixture
def db():
    con = duckdb.connect()
    con.execute(schema.builtin_ddl(schema.BUILTIN["phases"]))
    lock = threading.Lock()  # the display polls on its own thread; one DuckDB connection takes one call at a time

    def add(mesh, rank, phase, state, completed, total, unit="steps", elapsed=1.0, ts=None):
        with lock:
            con.execute("INSERT INTO phases VALUES ('r', to_timestamp(?), ?, ?, ?, 'h', ?, ?, ?, ?, ?, ?)",
                        [ts or time.time(), mesh, rank, f"{mesh}.{rank}", phase, state, completed, total, unit,
                         elapsed])

    def query(sql):
        with lock:
            return con.sql(sql).arrow().read_all()

    return con, add, query


def test_phase_status_sums_ranks_and_knows_a_total_only_when_every_rank_does(db):
    con, add, query = db
    t = time.time()
    add("trainer", 0, "SFT warm start", "started", 0, 100, ts=t)
    add("trainer", 0, "SFT warm start", "running", 40, 100, ts=t + 1)
    add("generator", 0, "engine start", "started", 0, None, "engines", ts=t + 2)
    add("generator", 1, "engine start", "done", 0, None, "engines", ts=t + 3)
    add("old", 0, "SFT warm start", "done", 5, 5, ts=t - 100)  # an earlier generation's row: not shown
    sft, engines = phase_status(query, t - 1)
    assert (sft.key, sft.completed, sft.total, sft.ranks, sft.done, sft.finished) == (
        "trainer: SFT warm start", 40, 100, 1, 0, False)
    assert (engines.key, engines.total, engines.ranks, engines.done) == ("generator: engine start", None, 2, 1)


def test_piped_display_prints_a_line_per_phase_and_one_when_it_is_done(db, monkeypatch):
    monkeypatch.setenv("RLMESH_PROGRESS", "plain")
    monkeypatch.setenv("RLMESH_PROGRESS_EVERY_S", "3600")
    con, add, query = db
    out = io.StringIO()
    with WarmupDisplay(query, stream=out, poll_s=0.05) as d:
        add("trainer", 0, "SFT warm start", "running", 40, 100)
        d.poll()
        add("trainer", 0, "SFT warm start", "running", 60, 100)
        d.poll()  # within RLMESH_PROGRESS_EVERY_S: no line
        add("trainer", 0, "SFT warm start", "done", 100, 100, elapsed=75.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[trainer: SFT warm start] 40/100 steps  elapsed")
    assert lines[-1] == "[trainer: SFT warm start] 100/100 steps  done  elapsed 1:15"
    assert len(lines) == 2


def test_bar_display_makes_one_task_per_phase(db, monkeypatch):
    monkeypatch.setenv("RLMESH_PROGRESS", "bar")
    con, add, query = db
    with WarmupDisplay(query, poll_s=0.05) as d:
        add("generator", 0, "engine start", "started", 0, None, "engines")
        add("trainer", 0, "SFT warm start", "running", 3, 10)
        d.poll()
        add("generator", 0, "engine start", "done", 0, None, "engines")
        add("trainer", 0, "SFT warm start", "done", 10, 10)
    tasks = {t.description: t for t in d._progress.tasks}
    assert set(tasks) == {"generator: engine start", "trainer: SFT warm start"}
    assert tasks["trainer: SFT warm start"].completed == 10 and tasks["trainer: SFT warm start"].finished
    assert tasks["generator: engine start"].finished  # no total: done when every rank is
