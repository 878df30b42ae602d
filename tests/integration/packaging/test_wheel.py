"""The built wheel, installed as a user installs it, runs a recipe from an empty directory.

Builds the wheel from a copy of its inputs (so the checkout gains no ``build/``), installs
it with ``torch==2.13.0`` into a venv of its own (no system site-packages, no PYTHONPATH:
nothing of the checkout is importable) and runs ``rlmesh run recipe=ppo_cartpole`` at a tiny
size from a directory outside the repo. Also checks that every file of ``configs/`` and
``recipes/`` is in the wheel, and that the optional parts (a Hydra sweeper plugin too), absent from a plain install, fail
with one line naming their extra.

The venv's dependencies take minutes to install, so the venv is cached under
``~/.cache/rlmesh/wheel-venv/<key>`` (``$RLMESH_WHEEL_VENV_CACHE``), keyed by a hash of the
project's dependencies (``pyproject.toml``), the Python version and the torch spec; the freshly
built wheel itself is reinstalled into it (``--no-deps``) on every run, so the test always checks
the current tree. The first run takes minutes (about 12 at a load of 18 on 2 cores); later ones
take what building the wheel and one tiny run take.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TORCH = "torch==2.13.0"
WHEEL_INPUTS = ("rlmesh", "configs", "recipes", "docs", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
CACHE = Path(os.environ.get("RLMESH_WHEEL_VENV_CACHE", Path.home() / ".cache" / "rlmesh" / "wheel-venv"))
TINY = ["recipe=ppo_cartpole", "generator.replicas=1", "generator.num_envs=2", "generator.num_steps=16",
        "trainer.total_steps=128", "trainer.num_minibatches=2", "trainer.update_epochs=1", "buffer=on_policy",
        "eval.every=64", "eval.episodes=2", "eval.target=null", "telemetry.health_interval_s=0"]

pytestmark = pytest.mark.slow


def clean_env() -> dict[str, str]:
    """The caller's environment without anything that would let the checkout or this test run leak in."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("RLMESH_")}
    env["RLMESH_LOG_LEVEL"] = "WARNING"
    return env


def sh(args: list, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in args], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, args))}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in WHEEL_INPUTS:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_shipped"))
        else:
            shutil.copy2(p, src / name)
    dist = tmp_path_factory.mktemp("dist")
    sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src], 600)
    (whl,) = dist.glob("rlmesh-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel) -> Path:
    """A venv holding rlmesh's dependencies (cached) and this very wheel (always reinstalled)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = "|".join([*sorted(project["dependencies"]), project["requires-python"], sys.version, TORCH])
    d = CACHE / hashlib.sha256(deps.encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once build one venv, not two half ones
        ready = d / ".rlmesh-ready"
        if not ready.exists():
            for old in CACHE.iterdir():  # venvs of other dependency sets: a GB each, not kept
                if old.is_dir() and old != d:
                    shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(d, ignore_errors=True)
            sh([sys.executable, "-m", "venv", d], 300)
            sh([d / "bin" / "python", "-m", "pip", "install", "-q", TORCH, wheel], 1800)
            ready.write_text(TORCH)
        else:
            sh([d / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel], 600)
    return d


def test_the_wheel_carries_every_config_and_recipe(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for tree in ("configs", "recipes", "docs"):
        files = [p.relative_to(ROOT).as_posix() for p in (ROOT / tree).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts]
        assert files
        missing = [f for f in files if f"rlmesh/_shipped/{f}" not in names]
        assert not missing, f"not in the wheel: {missing}"


def test_the_wheel_is_typed(wheel):
    """PEP 561: without the marker a user's checker ignores rlmesh's annotations (Endpoint[P, R], ...)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"rlmesh/py.typed", "rlmesh/actor/mypy_plugin.py"} <= names


@pytest.mark.timeout(2400)  # the first run installs torch and every dependency into a fresh venv
def test_installed_wheel_runs_a_recipe_from_an_empty_directory(venv, tmp_path):
    where = sh([venv / "bin" / "python", "-c", "import rlmesh; print(rlmesh.__file__)"], 60, cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel, not the checkout
    out = sh([venv / "bin" / "rlmesh", "run", *TINY], 600, cwd=tmp_path)
    assert "Query this run:" in out.stdout
    assert list(tmp_path.glob("runs/*/telemetry.duckdb")), sorted(p.name for p in tmp_path.rglob("*"))


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("argv, extra", [
    (["plot", "latest"], "rlmesh[plot]"),
    (["k8s", "cleanup", "some-run"], "rlmesh[kubernetes]"),
    (["run", "-m", "recipe=ppo_cartpole", "hydra/sweeper=optuna"], "rlmesh[sweep]"),   # docs/recipes.md's sweep
])
def test_an_absent_extra_fails_in_one_line_naming_it(venv, tmp_path, argv, extra):
    out = subprocess.run([str(venv / "bin" / "rlmesh"), *argv], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    err = out.stderr.strip()
    assert extra in err and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.mark.timeout(2400)
def test_help_points_to_docs_the_wheel_ships(venv, tmp_path):
    out = sh([venv / "bin" / "rlmesh", "run", "--help"], 120, cwd=tmp_path)
    docs = [Path(w.rstrip(",.")) for w in out.stdout.split() if w.endswith((".md", ".md,"))]
    assert docs, out.stdout[-2000:]
    assert all(p.is_file() and p.is_relative_to(venv) for p in docs), docs
