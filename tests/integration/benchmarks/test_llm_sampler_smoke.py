"""``benchmarks/llm_sampler.py --smoke``: both samplers on a tiny random Llama, interleaved, with the
ratio line and the JSON file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "llm_sampler.py"


@pytest.mark.timeout(300)
def test_smoke_prints_both_samplers_and_their_ratio(tmp_path):
    out = tmp_path / "sampler.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=280, env={**os.environ, "RLMESH_TELEMETRY": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "# versions:" in proc.stdout and "tokens/s ratio rlmesh / transformers: median" in proc.stdout
    rounds = json.loads(out.read_text())["rounds"]
    assert len(rounds) == 2 and all(r["rlmesh_tokens"] > 0 and r["transformers_tokens"] > 0 for r in rounds)
