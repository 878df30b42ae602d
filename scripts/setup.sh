#!/usr/bin/env bash
# Creates .venv at the repo root and installs rlmesh with its test dependencies.
# Idempotent: a second run only re-checks. torch is pinned to the CPU build first
# (torch==2.13.0) so that the range in pyproject.toml is already satisfied and pip
# never pulls a multi-GB CUDA wheel; set RLMESH_TORCH to choose another spec.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
stamp=".venv/.rlmesh-installed"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# Bytecode only for what is imported, not for everything installed. pip would compile each of the
# ~21,000 installed modules on one core, and compileall of them all took ~25 s on two; a run and the
# tests import under 10 % of them. So pip installs with --no-compile, then rlmesh's modules are
# imported once with bytecode writing on, which compiles exactly them and what they import (torch,
# DuckDB, zmq, gymnasium, Hydra...: ~1,900 modules, ~2 s). Anything else is compiled on its first
# import: run.sh and test.sh let Python write bytecode even where PYTHONDONTWRITEBYTECODE is set.
.venv/bin/python -m pip install --quiet --no-compile "${RLMESH_TORCH:-torch==2.13.0}"
.venv/bin/python -m pip install --quiet --no-compile -e ".[dev,hf]" --config-settings editable_mode=compat
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python - <<'PY'
import importlib, pkgutil, rlmesh
for m in pkgutil.walk_packages(rlmesh.__path__, "rlmesh.", onerror=lambda name: None):
    if m.name != "rlmesh.__main__":
        try:
            importlib.import_module(m.name)
        except Exception:  # an optional dependency that is not installed (vllm, pyverbs): skipped here
            pass
PY
echo "$want" > "$stamp"
