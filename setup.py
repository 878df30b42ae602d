"""Build hook only (metadata lives in pyproject.toml): ship ``configs/`` and ``recipes/`` inside the package.

Why: ``rlmesh run`` composes configs from ``configs/`` and runs programs from ``recipes/``,
which sit at the top of the source tree where users find and copy them. A wheel must carry
both, whole: every config group present now and any added later, with no list to keep in
step (a group missing from such a list once made every installed recipe fail with
``Could not find 'faults/none'``). So ``build_py`` copies both trees into the built package
as ``rlmesh/_shipped/{configs,recipes}``, where :func:`rlmesh.recipes.compose.config_dir` looks
when there is no source tree. Editable installs skip the copy: they run from the tree.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("configs", "recipes", "docs")  # top-level trees copied whole into rlmesh/_shipped/ (docs: `--help` names them)
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


class BuildPyWithShipped(build_py):
    """``build_py`` plus the ``configs/`` and ``recipes/`` trees under ``rlmesh/_shipped/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in SHIPPED:
            src, dst = ROOT / name, Path(self.build_lib) / "rlmesh" / "_shipped" / name
            if not src.is_dir():
                raise FileNotFoundError(f"{src} is missing: a wheel without it cannot run recipes")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, ignore=SKIP)


setup(cmdclass={"build_py": BuildPyWithShipped})
