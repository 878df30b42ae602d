"""The panel: every tuned preset against Stable-Baselines3's same algorithm with rl-baselines3-zoo's
hyperparameters, at equal env steps, seeds interleaved; and the LLM algorithms against each other.

Gym panel. Its rows are the presets under ``configs/recipe/<algo>/<env>.yaml`` (``recipe=ppo
generator.env_id=X`` runs the same file, docs/recipes.md) plus any row of ``PANEL`` that names its own
recipe. For each row and seed, rlmesh seed k then SB3 seed k, then seed k+1, ...; both at the row's
env-step budget (``PANEL``, times ``--scale``):

- **rlmesh**: ``rlmesh run recipe=<algo>/<env> trainer.total_steps=N run.seed=S generator.seed=S
  eval.every=0`` as a subprocess from an empty directory (the presets of PPO and A2C are strictly
  on-policy, as SB3 is);
- **SB3**: the same algorithm with the zoo's values for that env (``PANEL``), in a subprocess
  (``python benchmarks/algorithms.py --sb3 ALGO ENV SEED STEPS OUT``), model saved at the end.

Both final policies are then evaluated here with one protocol: :func:`rlmesh.rl.rollout.evaluate_greedy`,
``--episodes`` fresh episodes (default 10), greedy/deterministic actions; rlmesh's from its last
checkpoint (with its normalisation statistics, which live in the weights), SB3's from its saved model
(with its ``VecNormalize`` statistics where the zoo normalises). "wall s" is each whole process,
start-up included, the final evaluation excluded for SB3 (rlmesh's own end-of-run evaluation is one
episode). Printed: each seed's row, then per preset the mean ± std over seeds of each seed's mean
return, the seed spread (min..max), the mean wall times, and a ``ratio`` line of the per-seed wall
times (rlmesh / SB3). ``--json PATH`` writes all of it. Differences that remain, stated: the zoo runs
some envs with gSDE (state-dependent exploration) and a set initial log-std, which rlmesh's presets leave
off (each preset's comment says where and how to add it); rlmesh's DQN steps ``num_envs x num_steps``
transitions per train call where SB3 trains every ``train_freq`` steps (the same update-to-data ratio,
coarser grain).

LLM table (``--llm``): ``grpo_addition``, ``rloo_addition``, ``dapo_addition`` and ``drgrpo_addition`` at the
same budget (``--llm-steps`` train steps of ``prompts_per_step`` prompts after the same SFT warm start),
the held-out reward of each evaluation.

Run::

    pip install 'rlmesh[bench]'          # stable-baselines3, gymnasium[box2d] (LunarLander, BipedalWalker), gymnasium[mujoco]
    python benchmarks/algorithms.py                                   # every row, 3 seeds (hours)
    python benchmarks/algorithms.py --envs CartPole-v1 Acrobot-v1 --seeds 0 1 2 --json panel.json
    python benchmarks/algorithms.py --algos dqn --envs CartPole-v1 --seeds 0 1 2 3 4
    python benchmarks/algorithms.py --smoke                           # one tiny row, one seed: seconds
    python benchmarks/algorithms.py --llm --no-gym --llm-steps 100
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Report, add_common_args, banner, have  # noqa: E402

from rlmesh.recipes.compose import config_dir  # noqa: E402
from rlmesh.rl.actors.gym_generator import env_spaces  # noqa: E402
from rlmesh.rl.algorithms.dqn import QNetwork  # noqa: E402
from rlmesh.rl.models.mlp import ActorCritic  # noqa: E402
from rlmesh.rl.names import ENV_EXTRAS  # noqa: E402
from rlmesh.rl.rollout import evaluate_greedy, greedy_actor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    """One (algorithm, env) of the panel: the budget both sides get, SB3's zoo hyperparameters (``normalize``
    and ``n_envs`` as the zoo writes them; ``lin_X`` a linear decay from X), and rlmesh's recipe
    (default: the preset ``<algo>/<env>``)."""

    budget: int
    sb3: dict[str, Any]
    recipe: list[str] = field(default_factory=list)


_SB3_A2C_SDE = dict(ent_coef=0.0, max_grad_norm=0.5, n_steps=8, gae_lambda=0.9, vf_coef=0.4, use_rms_prop=True,
                    normalize_advantage=False, use_sde=True, policy_kwargs=dict(log_std_init=-2, ortho_init=False))
_SB3_DQN_CONTROL = dict(learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0, gamma=0.99,
                        target_update_interval=250, train_freq=4, gradient_steps=-1, exploration_fraction=0.12,
                        exploration_final_eps=0.1, policy_kwargs=dict(net_arch=[256, 256]))
_SB3_PPO_LUNAR = dict(n_envs=16, n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01)

PANEL: dict[tuple[str, str], Row] = {
    # rl-baselines3-zoo hyperparams/ppo.yml; budgets at or below the zoo's n_timesteps
    ("ppo", "CartPole-v1"): Row(100_000, dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                                              n_epochs=20, ent_coef=0.0, learning_rate="lin_0.001",
                                              clip_range="lin_0.2")),
    ("ppo", "Acrobot-v1"): Row(100_000, dict(normalize=True, n_envs=16, n_steps=256, gae_lambda=0.94, gamma=0.99,
                                             n_epochs=4, ent_coef=0.0)),
    ("ppo", "MountainCar-v0"): Row(200_000, dict(normalize=True, n_envs=16, n_steps=16, gae_lambda=0.98, gamma=0.99,
                                                 n_epochs=4, ent_coef=0.0)),
    ("ppo", "MountainCarContinuous-v0"): Row(20_000, dict(
        normalize=True, n_envs=1, batch_size=256, n_steps=8, gamma=0.9999, learning_rate=7.77e-5, ent_coef=0.00429,
        clip_range=0.1, n_epochs=10, gae_lambda=0.9, max_grad_norm=5, vf_coef=0.19, use_sde=True,
        policy_kwargs=dict(log_std_init=-3.29, ortho_init=False))),
    ("ppo", "Pendulum-v1"): Row(100_000, dict(n_envs=4, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10,
                                              ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, use_sde=True,
                                              sde_sample_freq=4)),
    ("ppo", "LunarLander-v3"): Row(300_000, _SB3_PPO_LUNAR),
    ("ppo", "LunarLanderContinuous-v3"): Row(300_000, _SB3_PPO_LUNAR),
    ("ppo", "BipedalWalker-v3"): Row(500_000, dict(normalize=True, n_envs=32, n_steps=2048, batch_size=64,
                                                   gae_lambda=0.95, gamma=0.999, n_epochs=10, ent_coef=0.0,
                                                   learning_rate=3e-4, clip_range=0.18)),
    # hyperparams/a2c.yml (SB3's A2C defaults elsewhere: RMSprop lr 7e-4, n_steps 5, no advantage normalisation)
    ("a2c", "CartPole-v1"): Row(50_000, dict(n_envs=8, ent_coef=0.0)),
    ("a2c", "Acrobot-v1"): Row(100_000, dict(normalize=True, n_envs=16, ent_coef=0.0)),
    ("a2c", "MountainCar-v0"): Row(200_000, dict(normalize=True, n_envs=16, ent_coef=0.0)),
    ("a2c", "MountainCarContinuous-v0"): Row(100_000, dict(
        normalize=True, n_envs=4, n_steps=100, ent_coef=0.0, use_sde=True, sde_sample_freq=16,
        policy_kwargs=dict(log_std_init=0.0, ortho_init=False))),
    ("a2c", "Pendulum-v1"): Row(200_000, dict(normalize=True, n_envs=8, gamma=0.9, learning_rate="lin_7e-4",
                                              **_SB3_A2C_SDE)),
    ("a2c", "LunarLander-v3"): Row(200_000, dict(n_envs=8, gamma=0.995, n_steps=5, learning_rate="lin_0.00083",
                                                 ent_coef=1e-5)),
    ("a2c", "LunarLanderContinuous-v3"): Row(300_000, dict(normalize=True, n_envs=4, gamma=0.99,
                                                           learning_rate="lin_7e-4", **_SB3_A2C_SDE)),
    ("a2c", "BipedalWalker-v3"): Row(500_000, dict(normalize=True, n_envs=16, gamma=0.99,
                                                   learning_rate="lin_0.00096", **_SB3_A2C_SDE)),
    # hyperparams/dqn.yml
    ("dqn", "CartPole-v1"): Row(50_000, dict(
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))),
    ("dqn", "Acrobot-v1"): Row(100_000, _SB3_DQN_CONTROL),
    ("dqn", "MountainCar-v0"): Row(120_000, dict(
        learning_rate=4e-3, batch_size=128, buffer_size=10_000, learning_starts=1000, gamma=0.98,
        target_update_interval=600, train_freq=16, gradient_steps=8, exploration_fraction=0.2,
        exploration_final_eps=0.07, policy_kwargs=dict(net_arch=[256, 256]))),
    ("dqn", "LunarLander-v3"): Row(100_000, _SB3_DQN_CONTROL),
    # SAC and TD3 on Pendulum-v1 (their recipes, configs/recipe/{sac,td3}_pendulum.yaml)
    ("sac", "Pendulum-v1"): Row(20_000, dict(learning_rate=1e-3), ["recipe=sac_pendulum"]),
    ("td3", "Pendulum-v1"): Row(20_000, dict(
        gamma=0.98, buffer_size=200_000, learning_starts=10_000, noise_std=0.1, gradient_steps=-1,
        train_freq=(1, "episode"), learning_rate=1e-3, policy_kwargs=dict(net_arch=[400, 300])), ["recipe=td3_pendulum"]),
    ("sac", "MountainCarContinuous-v0"): Row(50_000, dict(
        learning_rate=3e-4, buffer_size=50_000, batch_size=512, ent_coef=0.1, train_freq=32, gradient_steps=32,
        gamma=0.9999, tau=0.01, learning_starts=0, use_sde=True, policy_kwargs=dict(log_std_init=-3.67,
                                                                                    net_arch=[64, 64]))),
    ("sac", "LunarLanderContinuous-v3"): Row(500_000, dict(
        learning_rate="lin_7.3e-4", buffer_size=1_000_000, batch_size=256, ent_coef="auto", gamma=0.99, tau=0.01,
        train_freq=1, gradient_steps=1, learning_starts=10_000, policy_kwargs=dict(net_arch=[400, 300]))),
    ("sac", "BipedalWalker-v3"): Row(500_000, dict(
        learning_rate=7.3e-4, buffer_size=300_000, batch_size=256, ent_coef="auto", gamma=0.98, tau=0.02,
        train_freq=64, gradient_steps=64, learning_starts=10_000, use_sde=True,
        policy_kwargs=dict(log_std_init=-3, net_arch=[400, 300]))),
    # SAC on MuJoCo (hyperparams/sac.yml's mujoco-defaults: SB3's SAC with 10k random steps first), at a
    # reduced budget: 2% of the zoo's 1e6 (10k gradient steps), what fits a shared 2-core host
    ("sac", "Hopper-v5"): Row(20_000, dict(learning_starts=10_000)),
    ("sac", "HalfCheetah-v5"): Row(20_000, dict(learning_starts=10_000)),
}
"""SB3's side of every row, and the budget both sides get. A preset without a row here runs rlmesh only
(said as a baseline not run); a row with ``recipe`` set adds a recipe that is not a preset."""

SMOKE = ("ppo", "CartPole-v1", 256)
"""``--smoke``: one row, one seed, one rlmesh train step (8 envs x 32 steps) and as many SB3 steps."""


def panel_rows() -> list[tuple[str, str]]:
    """Every preset on disk (``configs/recipe/<algo>/<env>.yaml``, for each algorithm folder) and every
    ``PANEL`` row that names its own recipe (when that recipe exists), sorted by algorithm then env."""
    recipes = config_dir() / "recipe"
    found = {(d.name, f.stem) for d in recipes.iterdir() if d.is_dir() for f in d.glob("*.yaml")}
    named = {k for k, row in PANEL.items() if row.recipe and (recipes / f"{row.recipe[0].split('=', 1)[1]}.yaml").exists()}
    return sorted(found | named)


def recipe_args(algo: str, env_id: str) -> list[str]:
    row = PANEL.get((algo, env_id))
    return row.recipe if row is not None and row.recipe else [f"recipe={algo}/{env_id}"]


def missing_extra(env_id: str) -> str | None:
    """The extra an env needs and lacks here (``box2d`` for LunarLander without Box2D, ``mujoco`` for
    Hopper without MuJoCo), else ``None``."""
    import gymnasium  # deferred: only to read the registry entry's module

    entry = str(gymnasium.envs.registry[env_id].entry_point)
    for prefix, (package, extra) in ENV_EXTRAS.items():
        if entry.startswith(prefix) and not have(package):
            return extra
    return None


def _schedule(value: Any) -> Any:
    """rl-zoo's ``lin_X``: linear decay from X to 0 over training."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_left: progress_left * start
    return value


def sb3_main(algo: str, env_id: str, seed: int, steps: int, out: str) -> None:
    """Child process: train SB3 with the zoo hyperparameters, save the model (and VecNormalize stats)."""
    import stable_baselines3  # the bench extra: optional, imported only where SB3 runs
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    hp = dict(PANEL[(algo, env_id)].sb3)
    normalize, n_envs = hp.pop("normalize", False), hp.pop("n_envs", 1)
    noise_std = hp.pop("noise_std", None)
    hp = {k: _schedule(v) for k, v in hp.items()}
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if noise_std is not None:  # the zoo's noise_type: normal
        n = int(np.prod(env.action_space.shape))
        hp["action_noise"] = NormalActionNoise(np.zeros(n), noise_std * np.ones(n))
    if normalize:
        env = VecNormalize(env, gamma=hp.get("gamma", 0.99))
    cls = getattr(stable_baselines3, algo.upper())
    model = cls("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **hp)
    model.learn(total_timesteps=steps)
    model.save(os.path.join(out, "model"))
    if normalize:
        env.save(os.path.join(out, "vecnormalize.pkl"))


def eval_sb3(algo: str, env_id: str, out: str, episodes: int) -> list[float]:
    import stable_baselines3  # the bench extra: optional, imported only where SB3 runs

    model = getattr(stable_baselines3, algo.upper()).load(os.path.join(out, "model"), device="cpu")
    norm = None
    if os.path.exists(os.path.join(out, "vecnormalize.pkl")):
        with open(os.path.join(out, "vecnormalize.pkl"), "rb") as f:
            norm = pickle.load(f)

    def act(obs: np.ndarray) -> np.ndarray:
        if norm is not None:
            obs = np.clip((obs - norm.obs_rms.mean) / np.sqrt(norm.obs_rms.var + norm.epsilon), -norm.clip_obs,
                          norm.clip_obs)
        return model.predict(obs, deterministic=True)[0]

    return evaluate_greedy(act, env_id, episodes, seed=10_000)[1]


OFF_POLICY_ACTORS = {"sac": "rlmesh.rl.algorithms.sac:SquashedGaussianActor",
                     "td3": "rlmesh.rl.algorithms.td3:DeterministicActor"}
"""The actor of each off-policy algorithm's checkpoint (``actor.*``), the part that acts."""


def eval_rlmesh(algo: str, env_id: str, run_dir: str, episodes: int) -> list[float]:
    ckpt = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "step_*.pt")))[-1]
    obs_space, act_space = env_spaces(env_id)
    state = torch.load(ckpt, weights_only=False)["model"]
    if algo in OFF_POLICY_ACTORS:  # the actor only, its shape (and SAC's gSDE) from the run's trainer config
        module, name = OFF_POLICY_ACTORS[algo].split(":")
        with duckdb.connect(os.path.join(run_dir, "telemetry.duckdb"), read_only=True) as con:
            trainer = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])["trainer"]
        extra = {"use_sde": trainer["use_sde"]} if algo == "sac" else {}
        policy = getattr(importlib.import_module(module), name)(obs_space, act_space, trainer["hidden_sizes"], **extra)
        state = {k[len("actor."):]: v for k, v in state.items() if k.startswith("actor.")}
    else:
        policy = QNetwork(obs_space, act_space) if algo == "dqn" else ActorCritic(obs_space, act_space)
    policy.load_state_dict(state)
    return evaluate_greedy(greedy_actor(policy, act_space), env_id, episodes, seed=10_000)[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("RLMESH_START_TIMEOUT_S", "600")  # a loaded machine must slow a run down, not fail it
    return env


def run_rlmesh(algo: str, env_id: str, seed: int, steps: int, episodes: int, replicas: int = 1) -> dict:
    with tempfile.TemporaryDirectory(prefix="algos-rlmesh-") as tmp:
        # generator procs, as many as asked (the A2C presets collect in the trainer: one proc, no replicas)
        gens = [f"generator.replicas={replicas}", "generator.in_trainer=false"] if replicas != 1 else []
        args = [sys.executable, "-m", "rlmesh.cli", "run", *recipe_args(algo, env_id), *gens, f"trainer.total_steps={steps}",
                f"run.seed={seed}", f"generator.seed={seed}", "eval.every=0", "eval.target=null", "eval.episodes=1",
                "run.progress=false", "trainer.checkpoint_every=0", "telemetry.health_interval_s=0"]
        t0 = time.perf_counter()
        out = subprocess.run(args, cwd=tmp, env=_env(), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"rlmesh {algo} {env_id} failed:\n{out.stderr[-3000:]}")
        (run_dir,) = [os.path.dirname(p) for p in glob.glob(os.path.join(tmp, "runs", "2*", "telemetry.duckdb"))]
        return {"returns": eval_rlmesh(algo, env_id, run_dir, episodes), "wall_s": wall}


def run_sb3(algo: str, env_id: str, seed: int, steps: int, episodes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="algos-sb3-") as tmp:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--sb3", algo, env_id, str(seed), str(steps), tmp],
                             env=_env(), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"SB3 {algo} {env_id} failed:\n{out.stderr[-3000:]}")
        return {"returns": eval_sb3(algo, env_id, tmp, episodes), "wall_s": wall}


def _ms(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.1f} ± {statistics.pstdev(xs):.1f}" if xs else "—"


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.0f}..{max(xs):.0f}" if xs else "—"


def panel_row(args: argparse.Namespace, report: Report, summary: dict, name: str, algo: str, env_id: str,
              replicas: int, sb3_ok: bool) -> None:
    """One preset's seeds, interleaved: rlmesh seed k (with ``replicas`` generators), then SB3 seed k."""
    extra = missing_extra(env_id)
    if extra is not None:
        report.skipped(f"{algo}/{env_id}", f"needs the {extra} extra (pip install 'rlmesh[{extra}]')")
        return
    row = PANEL.get((algo, env_id))
    steps = SMOKE[2] if args.smoke else int((row.budget if row else 100_000) * args.scale)
    if row is None:
        report.skipped(f"sb3 {algo}/{env_id}", "no zoo hyperparameters for this preset in PANEL")
    acc = summary.setdefault((name, env_id, steps), {"r": [], "s": [], "rw": [], "sw": []})
    for seed in args.seeds:  # interleaved: rlmesh seed k, then SB3 seed k
        r = run_rlmesh(algo, env_id, seed, steps, args.episodes, replicas)
        # each side as soon as it ends: on a loaded host a pair takes an hour, and an interrupted run keeps this
        print(f"# rlmesh {name} {env_id} seed {seed}: {statistics.mean(r['returns']):.1f} in {r['wall_s']:.1f} s",
              flush=True)
        s = run_sb3(algo, env_id, seed, steps, args.episodes) if sb3_ok and row else None
        acc["r"].append(statistics.mean(r["returns"]))
        acc["rw"].append(r["wall_s"])
        if s is not None:
            acc["s"].append(statistics.mean(s["returns"]))
            acc["sw"].append(s["wall_s"])
        report.row(algo=name, env=env_id, steps=steps, seed=seed, rlmesh_return=acc["r"][-1],
                   rlmesh_wall_s=r["wall_s"], sb3_return=acc["s"][-1] if s else None,
                   sb3_wall_s=s["wall_s"] if s else None, episodes=args.episodes)
        print(f"| {name} | {env_id} | {steps} | {seed} | {_ms(r['returns'])} | {r['wall_s']:.1f} | "
              f"{_ms(s['returns']) if s else '—'} | {s['wall_s'] if s else float('nan'):.1f} |", flush=True)


def gym_panel(args: argparse.Namespace, report: Report) -> None:
    rows = [SMOKE[:2]] if args.smoke else [(a, e) for a, e in panel_rows() if a in args.algos and
                                           (args.envs is None or e in args.envs)]
    sb3_ok = have("stable_baselines3")
    if not sb3_ok:
        report.skipped("sb3", "stable-baselines3 is not installed (pip install 'rlmesh[bench]'); rlmesh runs alone")
    print("| algo | env | env steps | seed | rlmesh return | rlmesh wall s | SB3 return | SB3 wall s |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    summary: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for algo, env_id in rows:
        for n in (1,) if args.smoke else args.replicas:
            panel_row(args, report, summary, algo if n == 1 else f"{algo} ({n} generators)", algo, env_id, n, sb3_ok)
    print(f"\nPer preset: mean ± std over seeds of each seed's mean greedy return ({args.episodes} episodes), "
          "seed spread (min..max), mean whole-process wall time\n")
    print("| algo | env | env steps | seeds | rlmesh return | spread | SB3 return | spread | rlmesh wall s | "
          "SB3 wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (algo, env_id, steps), a in summary.items():
        if not a["r"]:
            continue
        print(f"| {algo} | {env_id} | {steps} | {len(a['r'])} | {_ms(a['r'])} | {_spread(a['r'])} | {_ms(a['s'])} | "
              f"{_spread(a['s'])} | {statistics.mean(a['rw']):.1f} | "
              f"{statistics.mean(a['sw']) if a['sw'] else float('nan'):.1f} |", flush=True)
        report.row(algo=algo, env=env_id, steps=steps, summary=True, seeds=len(a["r"]), rlmesh_returns=a["r"],
                   sb3_returns=a["s"], rlmesh_wall_s=a["rw"], sb3_wall_s=a["sw"])
    for (algo, env_id, _), a in summary.items():
        if a["sw"]:
            report.ratio(f"{algo.replace(' generators)', 'gen').replace(' (', '_')}/{env_id}_wall", [rw / sw for rw, sw in zip(a["rw"], a["sw"])], "rlmesh / SB3 wall s")


def a2c_core_policy(seed: int, steps: int) -> ActorCritic:
    """rlmesh's A2C alone, in this process: the generator's collector and the trainer's update
    (``ppo_update`` with ``a2c_loss`` and RMSprop) on CartPole-v1 with the ``a2c/CartPole-v1`` preset, its
    random draws seeded as ``rlmesh run`` seeds them (the trainer's init from ``run.seed``, the generator's
    sampling from ``generator.seed``), so it ends on the very weights the run's last checkpoint holds."""
    from rlmesh.recipes.compose import compose  # deferred: only the --core mode composes a preset here
    from rlmesh.rl.algorithms.a2c import a2c_loss
    from rlmesh.rl.algorithms.ppo import build_policy, ppo_update
    from rlmesh.rl.rollout import RolloutCollector

    cfg, _ = compose(["recipe=a2c/CartPole-v1", f"generator.seed={seed}", f"trainer.total_steps={steps}"])
    torch.manual_seed(seed)  # the trainer's init (Trainer.__init__)
    policy = build_policy(*env_spaces("CartPole-v1"), None, cfg.trainer)
    optimizer = torch.optim.RMSprop(policy.parameters(), lr=cfg.trainer.lr, alpha=cfg.trainer.rmsprop_alpha,
                                    eps=cfg.trainer.adam_eps)
    torch.manual_seed(seed)  # the generator's draws (GymGenerator.__init__)
    np.random.seed(seed)
    collector = RolloutCollector(cfg.generator, policy, seed=seed)
    version = 0
    while collector.total_steps < steps:
        ppo_update(policy, optimizer, collector.collect(policy_version=version), cfg.trainer, loss_fn=a2c_loss)
        version += 1
    collector.close()
    return policy


def a2c_core(seed: int, steps: int, episodes: int) -> float:
    """:func:`a2c_core_policy`'s greedy mean return."""
    policy = a2c_core_policy(seed, steps)
    return statistics.mean(evaluate_greedy(greedy_actor(policy), "CartPole-v1", episodes, seed=10_000)[1])


def sb3_a2c_core(seed: int, steps: int, episodes: int) -> float:
    from stable_baselines3 import A2C  # the bench extra: optional, imported only where SB3 runs
    from stable_baselines3.common.env_util import make_vec_env

    hp = dict(PANEL[("a2c", "CartPole-v1")].sb3)
    model = A2C("MlpPolicy", make_vec_env("CartPole-v1", n_envs=hp.pop("n_envs"), seed=seed), seed=seed, device="cpu",
                **hp)
    model.learn(total_timesteps=steps)
    return statistics.mean(evaluate_greedy(lambda obs: model.predict(obs, deterministic=True)[0], "CartPole-v1",
                                           episodes, seed=10_000)[1])


def core_table(args: argparse.Namespace, report: Report) -> None:
    """``--core``: A2C's update alone (no procs, no start-up), rlmesh's against SB3's, seed by seed in one
    process: separates the algorithm from the distributed recipe around it."""
    steps = SMOKE[2] if args.smoke else int(PANEL[("a2c", "CartPole-v1")].budget * args.scale)
    torch.set_num_threads(1)
    rl, sb, walls = [], [], []
    for seed in args.core_seeds:
        t0 = time.perf_counter()
        rl.append(a2c_core(seed, steps, args.episodes))
        t1 = time.perf_counter()
        sb.append(sb3_a2c_core(seed, steps, args.episodes))
        walls.append((t1 - t0) / (time.perf_counter() - t1))
        print(f"core a2c CartPole-v1 {steps} steps seed {seed}: rlmesh {rl[-1]:.1f}  SB3 {sb[-1]:.1f}", flush=True)
    print(f"core a2c CartPole-v1: rlmesh {_ms(rl)} ({_spread(rl)}), SB3 {_ms(sb)} ({_spread(sb)}) over "
          f"{len(rl)} seeds", flush=True)
    report.row(core="a2c", env="CartPole-v1", steps=steps, rlmesh_returns=rl, sb3_returns=sb)
    report.ratio("core_a2c/CartPole-v1_wall", walls, "rlmesh / SB3 train s, in process")


def sac_core_policy(seed: int, steps: int, rollout_steps: int = 1) -> torch.nn.Module:
    """rlmesh's SAC alone, in this process, in SB3's shape: the ``sac_pendulum`` recipe's networks,
    ``sac_update`` and replay ring, one env, the actor the update trains stepping the env itself (no policy
    lag), and the gradient steps the ratio owes taken after every ``rollout_steps`` env steps (1: SB3's loop,
    one env step then one gradient step; 64: the recipe's rollout size without the procs)."""
    from rlmesh.recipes.compose import compose  # deferred: only the --core mode composes a preset here
    from rlmesh.rl.algorithms.sac import SACModel, owed_gradient_steps, sac_optimizers, sac_update
    from rlmesh.rl.replay import TransitionReplayCore, transitions_from_rollout
    from rlmesh.rl.rollout import RolloutCollector

    cfg, _ = compose(["recipe=sac_pendulum", f"generator.seed={seed}", f"generator.num_steps={rollout_steps}",
                      f"trainer.total_steps={steps}"])
    c = cfg.trainer
    torch.manual_seed(seed)  # the trainer's init (Trainer.__init__)
    model = SACModel(*env_spaces(cfg.generator.env_id), c)
    opts = sac_optimizers(model, c.lr)
    np.random.seed(seed)
    collector = RolloutCollector(cfg.generator, model.actor, seed=seed)
    ring, rng, done, k = TransitionReplayCore(cfg.buffer), torch.Generator().manual_seed(seed), 0, 0
    while collector.total_steps < steps:
        model.actor.random_actions.fill_(collector.total_steps < c.learning_starts)
        ring.add(str(k), 0, transitions_from_rollout(collector.collect()))
        k += 1
        owed = owed_gradient_steps(collector.total_steps, c.learning_starts, c.gradient_steps, c.train_freq, done)
        sample = ring.sample(owed, c.batch_size, c.learning_starts, rng)
        if sample.transitions is not None:
            sac_update(model, opts, sample.transitions, c)
            done += owed
    collector.close()
    return model.actor


def sb3_sac_core(seed: int, steps: int) -> Any:
    """SB3's SAC with the zoo's Pendulum-v1 values (``PANEL``), trained in this process."""
    from stable_baselines3 import SAC  # the bench extra: optional, imported only where SB3 runs
    from stable_baselines3.common.env_util import make_vec_env

    model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=seed), seed=seed, device="cpu",
                **PANEL[("sac", "Pendulum-v1")].sb3)
    return model.learn(total_timesteps=steps)


def sac_core_table(args: argparse.Namespace, report: Report) -> None:
    """``--core-sac``: SAC's update alone on Pendulum-v1 (no procs, no start-up), seed by seed in one process:
    rlmesh with each of ``--core-sac-rollouts`` (env steps between update rounds; 1 is SB3's loop), then SB3.
    Separates the algorithm (rollout 1 against SB3) from the batching (rollout 64 against 1) and from the
    procs and their one rollout of policy lag (the panel's ``sac`` row against rollout 64)."""
    steps = SMOKE[2] if args.smoke else int(PANEL[("sac", "Pendulum-v1")].budget * args.scale)
    torch.set_num_threads(1)
    res: dict[str, list[float]] = {}
    secs: dict[str, list[float]] = {}
    for seed in args.core_seeds:
        for name in [f"rlmesh_rollout{n}" for n in args.core_sac_rollouts] + ["sb3"]:
            t0 = time.perf_counter()
            if name == "sb3":
                model = sb3_sac_core(seed, steps)
                act = lambda obs, m=model: m.predict(obs, deterministic=True)[0]  # noqa: E731
            else:
                act = greedy_actor(sac_core_policy(seed, steps, int(name[len("rlmesh_rollout"):])),
                                   env_spaces("Pendulum-v1")[1])
            secs.setdefault(name, []).append(time.perf_counter() - t0)
            res.setdefault(name, []).append(statistics.mean(evaluate_greedy(act, "Pendulum-v1", args.episodes,
                                                                            seed=10_000)[1]))
            print(f"core sac Pendulum-v1 {steps} steps seed {seed} {name}: {res[name][-1]:.1f} in "
                  f"{secs[name][-1]:.1f} s", flush=True)
    for name, xs in res.items():
        print(f"core sac Pendulum-v1 {name}: {_ms(xs)} ({_spread(xs)}) over {len(xs)} seeds, "
              f"{statistics.mean(secs[name]):.1f} s per seed", flush=True)
    report.row(core="sac", env="Pendulum-v1", steps=steps, returns=res, train_s=secs)


def llm_table(args: argparse.Namespace) -> None:
    print(f"\n| recipe | seed | held-out reward by train step (steps={args.llm_steps}) | wall s |")
    print("|---|---|---|---|")
    for seed in args.seeds:
        for recipe in ("grpo_addition", "rloo_addition", "dapo_addition", "drgrpo_addition"):
            with tempfile.TemporaryDirectory(prefix="algos-llm-") as tmp:
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", f"recipe={recipe}",
                                      f"steps={args.llm_steps}", f"eval.every={max(1, args.llm_steps // 4)}",
                                      f"run.seed={seed}", "run.progress=false", *args.llm_args],
                                     cwd=tmp, env=_env(), capture_output=True, text=True)
                wall = time.perf_counter() - t0
                if out.returncode != 0:
                    raise RuntimeError(f"{recipe} failed:\n{out.stderr[-3000:]}")
                (result,) = glob.glob(os.path.join(tmp, "runs", "2*", "result.json"))
                with open(result) as f:
                    evals = json.load(f)["evals"]
            curve = ", ".join(f"{int(s)}: {v:.3f}" for s, v in evals)
            print(f"| {recipe} | {seed} | {curve} | {wall:.0f} |", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sb3":
        algo, env_id, seed, steps, out = sys.argv[2:7]
        sb3_main(algo, env_id, int(seed), int(steps), out)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algos", nargs="+", default=sorted({a for a, _ in PANEL} | {a for a, _ in panel_rows()}))
    p.add_argument("--envs", nargs="+", default=None, help="only these env ids (default: every preset's)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--scale", type=float, default=1.0, help="multiply every row's env-step budget (reduced runs)")
    p.add_argument("--episodes", type=int, default=10, help="greedy evaluation episodes per seed")
    p.add_argument("--replicas", nargs="+", type=int, default=[1],
                   help="rlmesh generator counts to run per seed, interleaved (e.g. 1 2: asynchronous collection)")
    p.add_argument("--core", action="store_true",
                   help="also (or with --no-gym, only) A2C's update alone on CartPole-v1 against SB3's, in process")
    p.add_argument("--core-seeds", nargs="+", type=int, default=list(range(10)))
    p.add_argument("--core-sac", action="store_true",
                   help="also (or with --no-gym, only) SAC's update alone on Pendulum-v1 against SB3's, in process")
    p.add_argument("--core-sac-rollouts", nargs="+", type=int, default=[1, 64],
                   help="--core-sac: env steps between rlmesh's update rounds, one run per value (1: SB3's loop)")
    p.add_argument("--llm", action="store_true", help="also (or with --no-gym, only) the LLM table")
    p.add_argument("--no-gym", action="store_true")
    p.add_argument("--llm-steps", type=int, default=400)
    p.add_argument("--llm-args", nargs="*", default=[], help="extra overrides for the four LLM recipes")
    add_common_args(p, json_default="algorithms.json")
    args = p.parse_args()
    if args.smoke:
        args.seeds, args.core_seeds, args.episodes, args.llm = args.seeds[:1], args.core_seeds[:1], 2, False
    banner("algorithms: every preset against Stable-Baselines3 (rl-zoo hyperparameters), same env steps", "torch",
           "gymnasium", "stable-baselines3")
    report = Report("algorithms", smoke=args.smoke, args=vars(args))
    if not args.no_gym:
        gym_panel(args, report)
    if args.core and have("stable_baselines3"):
        core_table(args, report)
    if args.core_sac and have("stable_baselines3"):
        sac_core_table(args, report)
    if args.llm:
        llm_table(args)
    report.write(args.json)


if __name__ == "__main__":
    main()
