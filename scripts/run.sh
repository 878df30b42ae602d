#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the main job end to end on embedded defaults.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python examples/hello_mesh.py "$@"
