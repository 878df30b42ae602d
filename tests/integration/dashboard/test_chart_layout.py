"""The dashboard's charts as a user sees them in `rlmesh dashboard` (headless Chromium): plotly's toolbar
never covers a chart's title, and Compare puts runs whose values differ by orders of magnitude (a 2k-step
run's throughput beside a long run's) on a log axis instead of flattening the long run's line."""

import subprocess
import sys
from pathlib import Path

import pytest

from dash_helpers import base_of, chromium_or_skip, clean_env, start_dashboard, wait_for

pytest.importorskip("starlette")

RECORD = """
import datetime as dt, sys
import rlmesh as rm
n, gap_ms = int(sys.argv[1]), float(sys.argv[2])
t = dt.datetime.now(dt.timezone.utc)
for i in range(n):
    rm.telemetry.record("rollouts", ts=t + dt.timedelta(milliseconds=gap_ms * i), length=512, reward=20.0,
                        episodes=10, policy_version=i)
rm.telemetry.flush()
"""


def make_run(runs_dir: Path, rollouts: int, gap_ms: float) -> str:
    """A run whose rollouts rows land ``gap_ms`` apart (a telemetry run of this process, no procs)."""
    before = {p.name for p in runs_dir.iterdir()} if runs_dir.exists() else set()
    out = subprocess.run([sys.executable, "-c", RECORD, str(rollouts), str(gap_ms)], capture_output=True, text=True,
                         env=clean_env(RLMESH_RUNS_DIR=str(runs_dir)), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    (new,) = {p.name for p in runs_dir.iterdir() if p.is_dir() and p.name != "latest"} - before
    return new


def _rects_overlap(a: dict, b: dict) -> bool:
    return not (a["right"] <= b["left"] or b["right"] <= a["left"] or a["bottom"] <= b["top"] or b["bottom"] <= a["top"])


TITLE_AND_TOOLBAR = """
const d = document.getElementById(arguments[0]);
const t = d && d.querySelector('.gtitle'), m = d && d.querySelector('.modebar');
if (!t || !m) return null;
const r = (e) => { const b = e.getBoundingClientRect(); return {left: b.left, right: b.right, top: b.top, bottom: b.bottom}; };
return [r(t), r(m)];
"""


@pytest.mark.timeout(300)
def test_toolbar_clear_of_titles_and_compare_on_a_log_axis(tmp_path):
    runs = tmp_path / "runs"
    short = make_run(runs, 4, 2.0)         # 2k env steps in 6 ms: bins of ~1 ms, ~500k steps/s
    long = make_run(runs, 200, 500.0)      # 100k env steps over 100 s: ~1k steps/s
    driver = chromium_or_skip()
    proc, url, _ = start_dashboard(runs)
    try:
        driver.get(url)  # the token becomes the session's cookie
        driver.get(f"{base_of(url)}/compare?runs={short},{long}")
        layout = wait_for(lambda: driver.execute_script(
            "const d = document.getElementById('chart-throughput'); "
            "return d && d.layout && Number(d.dataset.points) > 0 ? d.layout : null;"), 120, "the throughput chart")
        assert layout["yaxis"]["type"] == "log", layout["yaxis"]
        assert layout["yaxis"]["title"]["text"].endswith("(log)")
        evals = driver.execute_script("return document.getElementById('chart-reward_env_steps').layout.yaxis.type;")
        assert evals == "linear"                                # the same return in both runs: no reason for a log axis

        driver.get(f"{base_of(url)}/run/{long}")
        for chart in ("chart-reward_env_steps", "chart-throughput"):
            title, toolbar = wait_for(lambda c=chart: driver.execute_script(TITLE_AND_TOOLBAR, c), 120, f"{chart}")
            assert not _rects_overlap(title, toolbar), (chart, title, toolbar)
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=30)
