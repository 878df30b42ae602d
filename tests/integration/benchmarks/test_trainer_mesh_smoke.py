"""``benchmarks/trainer_mesh.py --smoke``: the same GRPO step on a tiny model at 1 and 2 ranks, as a
user runs the script: real procs, a real gloo group, the table and the JSON file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "trainer_mesh.py"


@pytest.mark.timeout(300)
def test_smoke_prints_ratios_for_one_and_two_ranks(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    out = tmp_path / "trainer_mesh.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "# versions:" in proc.stdout and "# load at start:" in proc.stdout and "efficiency" in proc.stdout
    results = json.loads(out.read_text())["results"]
    one, two = results
    assert (one["ranks"], two["ranks"]) == (1, 2) and one["tokens_per_step"] == two["tokens_per_step"] > 0
    assert one["scaling_efficiency"] == 1.0 and two["scaling_efficiency"] > 0
    assert [r["rank"] for r in two["per_rank"]] == [0, 1]
    # FSDP2: each of two ranks holds about half of the parameters and the optimizer state of one rank
    held = [p["param_bytes"] + p["optim_bytes"] for p in two["per_rank"]]
    assert all(0.4 < h / one["per_rank"][0]["param_bytes"] / 3 < 0.6 for h in held), held
    # trainer.publish=sharded: each rank publishes its part, together the weights one rank publishes whole
    parts, whole = [p["publish_bytes"] for p in two["per_rank"]], one["per_rank"][0]["publish_bytes"]
    assert all(b > 0 for b in parts) and 0.9 < sum(parts) / whole < 1.2, (parts, whole)
    assert all(p["rss_peak_bytes"] >= p["rss_bytes"] > 0 for r in results for p in r["per_rank"])
