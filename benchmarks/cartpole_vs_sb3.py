"""CartPole-v1: the rlmesh ``ppo_cartpole`` recipe (actors in procs) and rlmesh's in-process PPO
core vs Stable-Baselines3 PPO (rl-zoo tuned), in the same run.

Claim: the ``ppo_cartpole`` recipe, run through ``rlmesh run`` with generator, buffer,
evaluator and trainer actors in their own procs and weights through ``rm.weights``, reaches
a mean greedy return >= 475 over 20 fresh episodes in no more wall-clock time than SB3 with
rl-baselines3-zoo's tuned CartPole-v1 settings (8 envs, n_steps 32, batch 256, 20 epochs,
lr 1e-3 linear, clip 0.2 linear, gamma 0.98, lambda 0.8).

Protocol: one torch thread per process; evaluate every ``--eval-every`` env steps with
:func:`rlmesh.rl.rollout.evaluate_greedy` (20 greedy episodes on a fresh vector env);
stop at the first evaluation >= 475. Env steps count real transitions trained on.

- ``recipe``: ``rlmesh run recipe=ppo_cartpole run.seed=S generator.seed=S`` as a subprocess;
  seconds are from the start of its controller loop (procs and actors already up; the
  process's whole wall time, start-up included, is printed as "proc s") to the moment
  the evaluation >= 475 comes back. Its evaluator runs concurrently with training, so
  evaluation is inside that time. It generates one rollout ahead (``max_policy_lag=1``).
- ``core``: :func:`rlmesh.rl.ppo_core.train_ppo`, the same maths in one process.
- ``sb3``: SB3 PPO, evaluated from a callback. "total s" includes evaluation time for the
  core and SB3 ("train s" excludes it). SB3 is a benchmark-only dependency::

    pip install stable-baselines3 --no-deps   # keeps torch==2.13.0+cpu

Run: ``python benchmarks/cartpole_vs_sb3.py --seeds 0 1 2``

Measured on the shared 2-core machine (load 2-5 during the run), seeds 0 1 2, 2026-12-02.
Env steps / seconds to >= 475 -- recipe: 14678 / 3.50, 10588 / 1.98, 4475 / 0.88 (each recipe
process 12.6-15.7 s in all, start-up included); core: 8602 / 1.43, 2496 / 0.35, 8612 / 1.61;
SB3: 18432 / 4.59, 10240 / 2.32, 14336 / 3.95. Medians: recipe 1.98 s, core 1.43 s, SB3 3.95 s;
ratio recipe/SB3 0.50 in time and 0.74 in env steps (core/SB3 0.36 and 0.60). The recipe
needs more env steps than the core because it trains one rollout behind (lag 1) and its
evaluations run alongside training, and it spends ~10 s starting 3 procs before its loop.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch

from rlmesh.recipes.compose import compose
from rlmesh.rl.ppo_core import train_ppo
from rlmesh.rl.rollout import evaluate_greedy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, have  # noqa: E402

TARGET = 475.0
EVAL_EPISODES = 20

RECIPE_ARGS: list[str] = []  # extra overrides for the recipe (--recipe-args)


def run_recipe(seed: int, eval_every: int, budget: int) -> dict:
    """The ppo_cartpole recipe through ``rlmesh run``, in a fresh directory; reads its result.json."""
    with tempfile.TemporaryDirectory(prefix="cartpole-recipe-") as tmp:
        # no PYTHONDONTWRITEBYTECODE: rlmesh runs from cached bytecode, as SB3 (compiled at install) does
        env = {k: v for k, v in os.environ.items()
               if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "PYTHONDONTWRITEBYTECODE")}
        env["RLMESH_RUNS_DIR"] = os.path.join(tmp, "runs")
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", "recipe=ppo_cartpole", f"run.seed={seed}",
                              f"generator.seed={seed}", f"trainer.total_steps={budget}", f"eval.every={eval_every}",
                              f"eval.target={TARGET}", "run.progress=false", *RECIPE_ARGS],
                             cwd=tmp, env=env, capture_output=True, text=True)
        proc_s = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"recipe failed:\n{out.stderr[-3000:]}")
        (result_file,) = [p for p in glob.glob(os.path.join(tmp, "runs", "2*", "result.json"))]
        with open(result_file) as f:
            r = json.load(f)
    last = r["evals"][-1][1] if r["evals"] else float("nan")
    return {"steps": r["solved_steps"], "train_s": None, "total_s": r["solved_s"], "last_eval": last, "proc_s": proc_s}


def run_rlmesh(seed: int, eval_every: int, budget: int, vectorization: str = "auto") -> dict:
    recipe, _ = compose(["recipe=ppo_cartpole"])  # the tuned preset; see configs/recipe/ppo_cartpole.yaml
    recipe.trainer.total_steps = budget
    recipe.generator.seed = seed
    recipe.generator.vectorization = vectorization
    result = train_ppo(recipe.generator, recipe.trainer, seed=seed, eval_every=eval_every,
                       eval_episodes=EVAL_EPISODES, target_return=TARGET)
    return {"steps": result.solved_steps, "train_s": result.solved_seconds, "total_s": result.solved_seconds_total,
            "last_eval": result.evals[-1][2] if result.evals else float("nan")}


def run_rlmesh_sync(seed: int, eval_every: int, budget: int) -> dict:
    """The same, stepping 8 separate CartPole envs in a Python loop (as SB3's DummyVecEnv
    does) instead of gymnasium's native vectorised CartPole: isolates the env's share."""
    return run_rlmesh(seed, eval_every, budget, vectorization="sync")


def run_sb3(seed: int, eval_every: int, budget: int) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class EvalAndStop(BaseCallback):
        """Evaluate right after each update (at rollout start), stop once solved."""

        def __init__(self) -> None:
            super().__init__()
            self.next_eval, self.eval_s, self.stop = eval_every, 0.0, False
            self.result: dict = {"steps": None, "train_s": None, "total_s": None, "last_eval": float("nan")}

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_rollout_start(self) -> None:
            if self.num_timesteps < self.next_eval:
                return
            self.next_eval += eval_every
            t0 = time.perf_counter()
            act = lambda obs: self.model.predict(obs, deterministic=True)[0]  # noqa: E731
            mean_return, _ = evaluate_greedy(act, "CartPole-v1", EVAL_EPISODES, seed + 10_000)
            self.eval_s += time.perf_counter() - t0
            self.result["last_eval"] = mean_return
            if mean_return >= TARGET:
                now = time.perf_counter()
                self.result.update(steps=self.num_timesteps, train_s=now - self.start - self.eval_s,
                                   total_s=now - self.start)
                self.stop = True

        def _on_step(self) -> bool:
            return not self.stop

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu", verbose=0)
    callback = EvalAndStop()
    model.learn(total_timesteps=budget, callback=callback)
    env.close()
    return callback.result


def fmt(x: float | int | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=2048, help="env steps between evaluations (both)")
    parser.add_argument("--budget", type=int, default=100_000, help="env-step budget per run (both)")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--only", nargs="+", default=["recipe", "core", "core-sync", "sb3"],
                        help="which of recipe, core, core-sync, sb3 to run")
    parser.add_argument("--recipe-args", nargs="*", default=[], help="extra Hydra overrides for the recipe")
    add_common_args(parser)
    args = parser.parse_args()
    if args.smoke:  # the in-process core against SB3, one seed, one evaluation (no target reached)
        args.seeds, args.eval_every, args.budget, args.only = [0], 1024, 1024, ["core", "sb3"]
    RECIPE_ARGS.extend(args.recipe_args)
    torch.set_num_threads(1)
    banner("CartPole-v1: ppo_cartpole and the in-process PPO core against SB3 PPO", "torch", "gymnasium",
           "stable-baselines3")
    report = Report("cartpole_vs_sb3", smoke=args.smoke, args=vars(args))
    if not have("stable_baselines3") and not args.skip_sb3:
        report.skipped("sb3", "stable-baselines3 is not installed (pip install stable-baselines3 --no-deps)")
        args.skip_sb3 = True
    print(f"python {platform.python_version()}  torch {torch.__version__}  gymnasium {gym.__version__}  "
          f"numpy {np.__version__}")
    print(f"machine {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()}  load={os.getloadavg()}")
    print(f"target mean greedy return >= {TARGET} over {EVAL_EPISODES} episodes, eval every {args.eval_every} steps\n")
    runners = {"recipe": run_recipe, "core": run_rlmesh, "core-sync": run_rlmesh_sync, "sb3": run_sb3}
    chosen = [n for n in runners if n in args.only and not (n == "sb3" and args.skip_sb3)]
    rows: dict[str, list[dict]] = {name: [] for name in chosen}
    for seed in args.seeds:
        for name in chosen:
            r = runners[name](seed, args.eval_every, args.budget)
            rows[name].append(r)
            extra = f"  proc s {r['proc_s']:6.1f}" if "proc_s" in r else ""
            print(f"{name:9s} seed {seed}: steps {fmt(r['steps'], '>6d')}  train s {fmt(r['train_s'], '6.2f')}  "
                  f"total s {fmt(r['total_s'], '6.2f')}  last eval {r['last_eval']:.1f}{extra}", flush=True)

    def median(name: str, key: str) -> float | None:
        if any(r[key] is None for r in rows[name]) and key == "train_s":
            return None
        vals = [r[key] if r[key] is not None else float("inf") for r in rows[name]]
        return statistics.median(vals) if vals else None

    print()
    for name in rows:
        if rows[name]:
            print(f"{name:9s} median: steps {median(name, 'steps'):.0f}  train s {fmt(median(name, 'train_s'), '.2f')}  "
                  f"total s {median(name, 'total_s'):.2f}")
    for name in rows:
        report.row(runner=name, runs=rows[name])
    if "sb3" in rows:
        for name in [n for n in rows if n != "sb3"]:
            for key in ("total_s", "steps"):
                both = [(a[key], b[key]) for a, b in zip(rows[name], rows["sb3"]) if a[key] and b[key]]
                if not both:
                    report.skipped(f"{name}_vs_sb3_{key}", f"no seed reached {TARGET:.0f} on both sides in the budget")
                    continue
                r = report.ratio(f"{name}_vs_sb3_{key}", [a / b for a, b in both], f"rlmesh {key} / SB3 {key}, per seed")
                if name == "recipe" and key == "total_s":
                    report.target("recipe_vs_sb3_time", r.median, 1.0)
    report.write(args.json)


if __name__ == "__main__":
    try:
        main()
    except ImportError as exc:
        raise SystemExit(f"{exc}\nInstall the benchmark-only baseline: pip install stable-baselines3 --no-deps") from exc
