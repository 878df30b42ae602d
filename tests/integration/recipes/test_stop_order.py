"""A recipe run stops its procs callers first, quietly (issue 37).

Stopped all at once, a generator still finishing the item it was working on when the run ended
met reward procs that had already exited and logged "scoring ... failed (the proc hosting this
actor died (exit code 0, stopped)); retrying on a live reward replica" every 50 ms, until the stop's
deadline killed it 5 s later. A short ``grpo_addition`` run with a quick final evaluation ends while
the generator is working ahead on the next item (the lag bound lets it), which is that case.
"""

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(420)

GRPO = ["recipe=grpo_addition", "steps=4", "eval.every=100", "eval.episodes=5", "trainer.sft_steps=20",
        "run.progress=false", "telemetry.proc_health_interval_s=0.5"]
WARNING = "retrying on a live reward replica"


def test_a_recipe_run_stops_callers_before_callees_without_a_warning(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RLMESH_RUNS_DIR": str(tmp_path / "runs")}
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *GRPO], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    text = out.stdout + out.stderr
    assert WARNING not in text, [ln for ln in text.splitlines() if WARNING in ln][:3]
    (db,) = (tmp_path / "runs").glob("2*/telemetry.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        logged = con.execute(f"SELECT count(*) FROM logs WHERE message LIKE '%{WARNING}%'").fetchone()[0]
        rescored = con.execute("SELECT count(*) FROM work_items WHERE event = 'rescored'").fetchone()[0]
        stops = con.execute("SELECT actors, epoch(ts) FROM actors WHERE event = 'stopped' ORDER BY ts").fetchall()
    assert (logged, rescored) == (0, 0)
    at = {role: ts for actors, ts in stops for role in ("generator", "trainer", "reward") if role in actors}
    assert at["generator"] <= at["trainer"] <= at["reward"], stops  # callers first, what they call last
    summary = next(ln for ln in out.stdout.splitlines() if "peak RSS per proc" in ln)
    assert "GB" in summary and "not sampled" not in summary, summary
