"""The type checker (mypy) and the linter (ruff) hold at zero errors; both run here, so the test command runs them.

Their configuration is ``[tool.mypy]`` and ``[tool.ruff]`` in ``pyproject.toml``; ``mypy`` and
``ruff check rlmesh tests benchmarks recipes examples`` from the repo root give the same answers by hand. mypy also checks
``tests/typecheck/check_api.py``: what a user's checker sees through the typed front door
(``Endpoint[P, R]``, ``ActorMesh[A]``, ``Future[R]``).

mypy's cache lives outside the checkout, in ``~/.cache/rlmesh/mypy`` (``RLMESH_MYPY_CACHE``), like the
Kubernetes binaries: a fresh clone then checks warm. A cold run takes ~33 s on two busy cores, a warm
one a few seconds; mypy trusts a cached module only when its source hash matches, so a cache written
by another checkout is safe. In subprocesses: mypy imports the plugin ``rlmesh.actor.mypy_plugin``,
and neither tool's state belongs in the test process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINTED = ["rlmesh", "tests", "benchmarks", "recipes", "examples"]
"""Every folder of Python the project ships: the library, its tests, benchmarks, recipes and examples."""
MYPY_CACHE = os.environ.get("RLMESH_MYPY_CACHE") or str(Path.home() / ".cache" / "rlmesh" / "mypy")


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)
def test_mypy_finds_no_errors():
    pytest.importorskip("mypy", reason="the type checker is in the dev extra: pip install -e '.[dev]'")
    proc = run([sys.executable, "-m", "mypy", "--cache-dir", MYPY_CACHE], timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mypy (config: pyproject.toml [tool.mypy]):\n{out[-6000:]}"
    assert "Success: no issues found" in out


def test_ruff_finds_no_errors():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("the linter is in the dev extra: pip install -e '.[dev]'")
    proc = run([ruff, "check", "--no-cache", *LINTED], timeout=120)
    assert proc.returncode == 0, f"ruff check {' '.join(LINTED)} (config: pyproject.toml [tool.ruff]):\n{proc.stdout[-6000:]}{proc.stderr}"


def test_the_api_check_fails_when_a_claim_is_wrong(tmp_path):
    """The typing claims have teeth: the same file with one result type wrong fails mypy."""
    pytest.importorskip("mypy", reason="the type checker is in the dev extra")
    src = (ROOT / "tests" / "typecheck" / "check_api.py").read_text()
    claim = 'assert_type(mesh.score.call_one("x").get(), float)'
    assert claim in src
    bad = tmp_path / "check_api_wrong.py"
    bad.write_text(src.replace(claim, claim.replace("float", "int")))
    proc = run([sys.executable, "-m", "mypy", "--cache-dir", MYPY_CACHE, str(bad)], timeout=280)
    assert proc.returncode == 1 and 'Expression is of type "float", not "int"' in proc.stdout, proc.stdout[-3000:]
