"""``benchmarks/run_all.py --merge``: one table from several sittings' ``results.json``, each row saying how many
runs it has (a full set once, a part of it more often), and ``--doc`` writes it as a page."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def result(name: str, medians: dict[str, float], load: float) -> dict:
    return {"name": name, "command": f"python benchmarks/{name}.py", "wall_s": 1.0, "load_start": load,
            "load_end": load, "machine": "x86_64 2 cores", "versions": "rlmesh 0.1.0",
            "ratios": [{"name": k, "median": v, "p90": v * 1.1, "rounds": [v, v], "unit": "a / b"}
                       for k, v in medians.items()],
            "targets": [{"name": "t", "measured": medians["x"], "target": 0.5, "at_most": True, "met": medians["x"] <= 0.5}]}


def test_merge_spreads_each_row_over_the_runs_that_have_it(tmp_path):
    full, quick = tmp_path / "full", tmp_path / "quick"
    full.mkdir(), quick.mkdir()
    (full / "results.json").write_text(json.dumps([[result("fast", {"x": 0.4}, 1.0), result("slow", {"x": 0.9}, 2.0)]]))
    (quick / "results.json").write_text(json.dumps([[result("fast", {"x": 0.6}, 3.0)], [result("fast", {"x": 0.45}, 1.5)]]))
    doc = tmp_path / "page.md"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--merge", str(full), str(quick),
                          "--out", str(tmp_path / "merged"), "--doc", str(doc)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "merged" / "table.md").read_text()
    assert "| fast | x | 0.40–0.60 | 0.66 | 3 | 6 | 1.00–3.00 | a / b |" in text  # three runs: one full, two quick
    assert "| slow | x | 0.90 | 0.99 | 1 | 2 | 2.00 | a / b |" in text            # the full run only
    assert "| fast | t | 0.40–0.60x | ≤ 0.5x | 2 of 3 |" in doc.read_text()
    assert doc.read_text().startswith("# The benchmark set") and "x86_64 2 cores" in doc.read_text()


def test_merge_names_a_directory_without_results(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--merge", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode != 0 and f"no {tmp_path / 'results.json'}" in out.stderr
