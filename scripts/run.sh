#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the main job end to end on embedded defaults:
# the ppo_cartpole recipe (PPO on CartPole-v1 with generator, buffer, evaluator and trainer
# actors in local procs, CPU, telemetry in runs/<run>/telemetry.duckdb). It stops once the
# greedy policy averages >= 475 over 20 fresh episodes and prints a summary and SQL to try.
# Extra arguments are Hydra overrides: bash scripts/run.sh trainer.lr=1e-3 generator.replicas=2
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Python writes bytecode on first import even where the environment says not to: without it every
# process recompiles torch and the rest of what it imports (scripts/setup.sh compiles only what rlmesh imports).
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh
exec .venv/bin/rlmesh run recipe=ppo_cartpole "$@"
