#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the whole test suite. Extra args go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests -q "$@"
