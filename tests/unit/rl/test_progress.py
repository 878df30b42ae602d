"""Progress people and agents can follow: ETA, plain or JSON lines when stdout is not a terminal."""

import io
import json

from rlmesh.rl.run.report import RunProgress, eta_s, progress_format


def test_eta_is_the_average_rate_so_far():
    assert eta_s(25, 100, 10.0) == 30.0
    assert eta_s(0, 100, 10.0) is None
    assert eta_s(100, 100, 10.0) == 0.0


def test_piped_progress_prints_plain_lines_with_eta(monkeypatch):
    monkeypatch.setenv("RLMESH_PROGRESS_EVERY_S", "0")
    out = io.StringIO()
    assert progress_format(True, out) == "plain"
    with RunProgress(10, "steps", stream=out) as bar:
        bar.update(5, step=5, reward=0.5, sps=100.0, lag=1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[train] 5/10 steps (50%)  step 5  reward 0.500")
    assert "eta 0:" in lines[0] and lines[1].endswith("done")


def test_json_progress_lines_for_agents(monkeypatch):
    monkeypatch.setenv("RLMESH_PROGRESS", "json")
    monkeypatch.setenv("RLMESH_PROGRESS_EVERY_S", "3600")
    out = io.StringIO()
    with RunProgress(4, "steps", stream=out) as bar:
        bar.update(1, step=1)
        bar.update(2, step=2)  # within the interval: no line
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [d["final"] for d in docs] == [False, True]
    assert docs[0]["progress"]["completed"] == 1 and docs[1]["progress"]["completed"] == 2
    assert docs[0]["progress"]["reward"] is None  # NaN is not JSON


def test_off_is_silent(monkeypatch):
    monkeypatch.setenv("RLMESH_PROGRESS", "off")
    out = io.StringIO()
    with RunProgress(3, stream=out) as bar:
        bar.update(3)
    assert out.getvalue() == ""


def test_proc_memory_line_names_procs_by_their_actors_biggest_first():
    from rlmesh.rl.run.report import proc_memory_line

    gb = 2**30
    procs = [{"proc": "rl.3", "actors": "generator/0", "peak_rss": 0.7 * gb, "warnings": 1},
             {"proc": "controller", "actors": None, "peak_rss": 0.42 * gb, "warnings": 0}]
    assert proc_memory_line(procs) == "generator/0 0.70 GB (growing), controller 0.42 GB"
    assert proc_memory_line(procs, most=1) == "generator/0 0.70 GB (growing), 1 more"
    assert proc_memory_line([]) == "not sampled"
