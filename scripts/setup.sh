#!/usr/bin/env bash
# Creates .venv at the repo root and installs rlmesh with its test dependencies.
# Idempotent: a second run only re-checks. torch is pinned to the CPU build first
# (torch==2.13.0) so that the range in pyproject.toml is already satisfied and pip
# never pulls a multi-GB CUDA wheel; set RLMESH_TORCH to choose another spec.
#
# Where the installed packages come from: a built venv is kept outside the checkout, in
# ${RLMESH_VENV_CACHE:-~/.cache/rlmesh/venv}/<hash of pyproject.toml and this script>, like the
# Kubernetes binaries and the model. A fresh clone (CI) gets its .venv as a hard-linked copy of it
# (~3 s, no extra disk) instead of installing ~2.8 GB of wheels again (~40 s); the copy is then made
# this checkout's own: its scripts' #! lines and the editable rlmesh point here, never at the
# checkout that built the cache (each of those files is replaced, not edited in place, so the
# cache's hard-linked original stays as it was). Where a hard link cannot be made (another file
# system) the copy is a plain one. RLMESH_VENV_CACHE=0 builds .venv in place, as before.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
stamp=".venv/.rlmesh-installed"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

install_into() {  # install_into VENV: the packages, with rlmesh editable from this checkout
  local v="$1"
  [ -x "$v/bin/python" ] || "$py" -m venv "$v"
  "$v/bin/python" -m pip install --quiet --upgrade pip
  # Bytecode only for what is imported, not for everything installed: pip would compile each of the
  # ~21,000 installed modules on one core (~25 s on two); a run and the tests import under 10 % of
  # them. So pip installs with --no-compile and compile_imported (below) compiles what rlmesh imports.
  "$v/bin/python" -m pip install --quiet --no-compile "${RLMESH_TORCH:-torch==2.13.0}"
  "$v/bin/python" -m pip install --quiet --no-compile -e ".[dev,hf]" --config-settings editable_mode=compat
}

compile_imported() {  # rlmesh's modules imported once with bytecode on: compiles them and what they
  # import (torch, DuckDB, zmq, gymnasium, Hydra...: ~1,900 modules); anything else compiles on first
  # import (run.sh and test.sh let Python write bytecode even where PYTHONDONTWRITEBYTECODE is set)
  env -u PYTHONDONTWRITEBYTECODE "$1/bin/python" - <<'PY'
import importlib, pkgutil, rlmesh
for m in pkgutil.walk_packages(rlmesh.__path__, "rlmesh.", onerror=lambda name: None):
    if m.name != "rlmesh.__main__":
        try:
            importlib.import_module(m.name)
        except Exception:  # an optional dependency that is not installed (vllm, pyverbs): skipped here
            pass
PY
}

make_own() {  # make_own FROM: .venv (a copy of the venv at FROM) points at itself and this checkout
  local from="$1" f
  for f in .venv/bin/* .venv/pyvenv.cfg; do
    [ -f "$f" ] && [ ! -L "$f" ] && grep -qF "$from" "$f" 2>/dev/null || continue
    # sed -i writes a new file and renames it over the old name: the hard link to the cache breaks
    sed -i -e "s|$from/bin/|$root/.venv/bin/|g" -e "s|$from|$root/.venv|g" "$f"
  done
  # the editable rlmesh: the checkout that built the cache -> this one (compat mode: a .pth holding
  # its path, and pip's record of where it came from)
  for f in .venv/lib/python*/site-packages/__editable__.rlmesh-*.pth; do
    rm -f "$f"
    echo "$root" > "$f"
  done
  for f in .venv/lib/python*/site-packages/rlmesh-*.dist-info/direct_url.json; do
    rm -f "$f"
    printf '{"dir_info": {"editable": true}, "url": "file://%s"}\n' "$root" > "$f"
  done
}

cache_root="${RLMESH_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlmesh/venv}"
if [ "$cache_root" = "0" ]; then
  install_into .venv
  compile_imported .venv
  echo "$want" > "$stamp"
  exit 0
fi

cached="$cache_root/$want"
mkdir -p "$cache_root"
exec 9> "$cache_root/.lock"
flock 9  # one builder at a time; a second checkout waits, then copies what the first built
if [ ! -f "$cached/.rlmesh-installed" ]; then
  echo "setup: building the venv once into $cached (later clones copy it)"
  rm -rf "$cached.tmp"
  install_into "$cached.tmp"
  compile_imported "$cached.tmp"
  echo "$want" > "$cached.tmp/.rlmesh-installed"
  # the venv's own paths name $cached.tmp: the copies rewrite them (make_own) whatever they say
  echo "$cached.tmp" > "$cached.tmp/.rlmesh-built-at"
  mv "$cached.tmp" "$cached"
  # older builds (another pyproject.toml) are ~2.8 GB each: keep only this one
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -name "$want" -exec rm -rf {} +
fi
flock -u 9
rm -rf .venv
cp -al "$cached" .venv 2>/dev/null || { rm -rf .venv; cp -a "$cached" .venv; }
make_own "$(cat "$cached/.rlmesh-built-at")"
rm -f .venv/.rlmesh-built-at
compile_imported .venv  # only rlmesh's own modules are new here: their bytecode lives in the checkout
rm -f "$stamp"  # the copy's stamp is a hard link to the cache's: a new file, not a write through it
echo "$want" > "$stamp"
