#!/usr/bin/env bash
# Makes Debian's pyverbs (rdma-core's Python bindings) importable from rlmesh's venv.
#
# Why not pip: PyPI's pyverbs only builds with Cython<3.1 and then fails to load
# against the system's rdma-core; Debian's python3-pyverbs matches the installed
# libibverbs. Only the pyverbs package is exposed (a symlink in a folder of its own
# plus a .pth), so the rest of /usr/lib/python3/dist-packages never shadows the venv.
# The venv's Python must have the same minor version as Debian's (3.11 on bookworm).
#
#   apt-get install -y python3-pyverbs      # as root, once per machine
#   scripts/setup_rdma.sh                   # once per venv (idempotent)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
src="${PYVERBS_DIR:-/usr/lib/python3/dist-packages/pyverbs}"
if [ ! -d "$src" ]; then
  echo "setup_rdma: $src not found; install it first: apt-get install -y python3-pyverbs" >&2
  exit 1
fi
sys_ver="$(ls "$src"/device.cpython-*.so | sed -E 's/.*cpython-([0-9]+)-.*/\1/' | head -1)"
venv_ver="$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
if [ "$sys_ver" != "$venv_ver" ]; then
  echo "setup_rdma: pyverbs is built for CPython $sys_ver but the venv runs $venv_ver; they must match" >&2
  exit 1
fi
shim="$venv/rlmesh-system-pyverbs"
mkdir -p "$shim"
ln -sfn "$src" "$shim/pyverbs"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$shim" > "$site/rlmesh-pyverbs.pth"
"$venv/bin/python" - <<'PY'
import pyverbs
from rlmesh.weights.rdma_plan import available
ok, why = available()
print(f"pyverbs {pyverbs.__file__}: " + (f"RDMA device {why}" if ok else why))
PY
