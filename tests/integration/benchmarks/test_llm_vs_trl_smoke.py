"""``benchmarks/llm_vs_trl.py --smoke``: rlmesh's ``grpo_gsm8k`` and TRL's ``GRPOTrainer`` on the real
small model (2 steps of 2 prompts x 4 completions, 8 new tokens), as a user runs the script.

TRL is a benchmark-only dependency (the ``bench`` extra), which ``scripts/setup.sh`` does not
install, so on a fresh machine TRL is absent. The test does not skip then: the script still runs
rlmesh's side in full and must print TRL's row as "not installed" with the reason and the install
command, which is what the test checks. Where TRL is installed, both sides must print a measured row
and the ratio line. Either way rlmesh's row, its held-out accuracy before and after (read from its
own ``evals`` table) and the JSON file are checked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "llm_vs_trl.py"
ROW = r"\s+seed 0\s+[\d.]+\s+[\d.—]+\s+[\d.—]+\s+[\d.]+\s+[\d.]+ -> [\d.]+"


@pytest.mark.timeout(420)
def test_smoke_prints_a_row_for_each_side(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    out = tmp_path / "llm_vs_trl.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    text = proc.stdout
    assert re.search(r"^rlmesh" + ROW, text, re.M), text
    assert "# versions:" in text and "pinned to CPUs" in text and "# load at start:" in text
    data = json.loads(out.read_text())
    (mesh,) = [r for r in data["results"] if r["side"] == "rlmesh"]
    assert mesh["steps"] == 2 and mesh["s_per_step"] > 0 and mesh["trained_rows"] == 2 * 2 * 4
    assert mesh["heldout_before"] is not None and mesh["heldout_after"] is not None
    (trl,) = [r for r in data["results"] if r["side"] == "trl"]
    if importlib.util.find_spec("trl") is None:
        assert re.search(r"^trl\s+seed 0\s+not installed: trl is not installed: .*pip install", text, re.M), text
        assert "no ratio (only rlmesh ran)" in text
        assert "skipped" in trl
    else:
        assert re.search(r"^trl/1t" + ROW, text, re.M), text
        assert re.search(r"^seed 0 vs trl/1t: s/step [\d.]+", text, re.M), text
        assert trl["steps"] == 2 and trl["prompt_ids_match_rlmesh"] is True
        assert trl["heldout_before"] is not None and trl["torch_threads"] == {"trl": 1}
        assert len(trl["affinity"]) >= 1
