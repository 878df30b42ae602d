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
.venv/bin/python -m pip install --quiet "${RLMESH_TORCH:-torch==2.13.0}"
.venv/bin/python -m pip install --quiet -e ".[dev,hf]" --config-settings editable_mode=compat
echo "$want" > "$stamp"
