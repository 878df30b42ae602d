"""Every gym algorithm rlmesh ships against Stable-Baselines3's same algorithm, and the LLM algorithms
against each other.

Gym table. For each (algorithm, env) pair, seeds interleaved (rlmesh seed 0, SB3 seed 0, rlmesh
seed 1, ...), both at the same env-step budget:

- **rlmesh**: ``rlmesh run recipe=<preset> <overrides> trainer.total_steps=N run.seed=S
  generator.seed=S eval.every=0`` as a subprocess from an empty directory;
- **SB3**: the same algorithm with rl-baselines3-zoo's tuned hyperparameters (``ZOO`` below), in a
  subprocess (``python benchmarks/algorithms.py --sb3 ALGO ENV SEED STEPS OUT``), model saved at the end.

Both final policies are then evaluated here with one protocol: :func:`rlmesh.rl.rollout.evaluate_greedy`,
``--episodes`` fresh episodes (default 10), greedy/deterministic actions; rlmesh's from its last
checkpoint (with its normalisation statistics, which live in the weights), SB3's from its saved model
(with its ``VecNormalize`` statistics where the zoo normalises). "wall s" is the whole process,
start-up included, evaluation excluded for both.

PPO and A2C run strictly on-policy (``buffer=on_policy``), as SB3 does; the presets' default
generates one version ahead (``--one-ahead`` measures that instead). Differences that remain,
stated: SB3's zoo runs Pendulum with gSDE (state-dependent exploration),
which rlmesh does not implement (a plain diagonal Gaussian); rlmesh's DQN steps ``num_envs x num_steps``
transitions per train call where SB3 trains every ``train_freq`` steps of one env (the same
update-to-data ratio, coarser grain).

LLM table (``--llm``): ``grpo_addition``, ``rloo_addition``, ``dapo_addition`` and ``drgrpo_addition`` at the same budget
(``--llm-steps`` train steps of ``prompts_per_step`` prompts after the same SFT warm start), the
held-out reward of each evaluation.

Run::

    pip install 'rlmesh[bench]'          # stable-baselines3, gymnasium[box2d] (LunarLander)
    python benchmarks/algorithms.py                                   # full size, 3 seeds (hours)
    python benchmarks/algorithms.py --algos ppo dqn --envs CartPole-v1 --seeds 0 --scale 0.5
    python benchmarks/algorithms.py --llm --llm-steps 100
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import banner  # noqa: E402

from rlmesh.rl.actors.gym_generator import env_spaces  # noqa: E402
from rlmesh.rl.algorithms.dqn import QNetwork  # noqa: E402
from rlmesh.rl.models.mlp import ActorCritic  # noqa: E402
from rlmesh.rl.rollout import evaluate_greedy, greedy_actor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# (algorithm, env) -> (budget, rlmesh recipe + overrides, SB3 zoo hyperparameters)
GYM: dict[tuple[str, str], tuple[int, list[str], dict]] = {
    ("ppo", "CartPole-v1"): (100_000, ["recipe=ppo_cartpole"], dict(
        n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
        learning_rate="lin_0.001", clip_range="lin_0.2")),
    ("ppo", "Acrobot-v1"): (200_000, [
        "recipe=ppo_cartpole", "generator.env_id=Acrobot-v1", "generator.num_envs=16", "generator.num_steps=256",
        "trainer.gamma=0.99", "trainer.gae_lambda=0.94", "trainer.update_epochs=4", "trainer.num_minibatches=64",
        "trainer.lr=3e-4", "trainer.anneal_lr=false", "trainer.anneal_clip=false", "trainer.normalize_obs=true",
        "trainer.normalize_reward=true"], dict(
        normalize=True, n_envs=16, n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0)),
    ("ppo", "Pendulum-v1"): (200_000, ["recipe=ppo_pendulum"], dict(
        normalize=True, n_envs=4, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
        learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4)),
    ("ppo", "LunarLander-v3"): (300_000, [
        "recipe=ppo_cartpole", "generator.env_id=LunarLander-v3", "generator.num_envs=16", "generator.num_steps=1024",
        "trainer.gamma=0.999", "trainer.gae_lambda=0.98", "trainer.update_epochs=4", "trainer.num_minibatches=256",
        "trainer.lr=3e-4", "trainer.anneal_lr=false", "trainer.anneal_clip=false", "trainer.entropy_coef=0.01"], dict(
        n_envs=16, n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01)),
    ("a2c", "CartPole-v1"): (100_000, ["recipe=a2c_cartpole", "generator.num_steps=5"], dict(n_envs=8, ent_coef=0.0)),
    ("a2c", "Acrobot-v1"): (200_000, [
        "recipe=a2c_cartpole", "generator.env_id=Acrobot-v1", "generator.num_envs=16", "generator.num_steps=5",
        "trainer.normalize_obs=true", "trainer.normalize_reward=true"], dict(normalize=True, n_envs=16, ent_coef=0.0)),
    ("a2c", "Pendulum-v1"): (200_000, [
        "recipe=a2c_cartpole", "generator=pendulum", "generator.num_envs=8", "generator.num_steps=8",
        "trainer.gamma=0.9", "trainer.gae_lambda=0.9", "trainer.value_coef=0.4", "trainer.anneal_lr=true",
        "trainer.normalize_obs=true", "trainer.normalize_reward=true"], dict(
        normalize=True, n_envs=8, ent_coef=0.0, max_grad_norm=0.5, n_steps=8, gae_lambda=0.9, vf_coef=0.4,
        gamma=0.9, use_rms_prop=True, normalize_advantage=False, learning_rate="lin_7e-4", use_sde=True,
        policy_kwargs=dict(log_std_init=-2, ortho_init=False))),
    ("a2c", "LunarLander-v3"): (200_000, [
        "recipe=a2c_cartpole", "generator.env_id=LunarLander-v3", "generator.num_envs=8", "generator.num_steps=5",
        "trainer.gamma=0.995", "trainer.lr=0.00083", "trainer.anneal_lr=true", "trainer.entropy_coef=1e-5"], dict(
        n_envs=8, gamma=0.995, n_steps=5, learning_rate="lin_0.00083", ent_coef=1e-5)),
    ("dqn", "CartPole-v1"): (50_000, ["recipe=dqn_cartpole"], dict(
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))),
    **{("dqn", env): (100_000, [
        "recipe=dqn_cartpole", f"generator.env_id={env}", "generator.num_envs=4", "generator.num_steps=16",
        "buffer.capacity=50000", "trainer.lr=6.3e-4", "trainer.batch_size=128", "trainer.gradient_steps=64",
        "trainer.learning_starts=128", "trainer.target_update_every=250", "trainer.exploration_fraction=0.12",
        "trainer.exploration_final_eps=0.1"], dict(
        learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0, gamma=0.99,
        target_update_interval=250, train_freq=4, gradient_steps=-1, exploration_fraction=0.12,
        exploration_final_eps=0.1, policy_kwargs=dict(net_arch=[256, 256]))) for env in ("Acrobot-v1", "LunarLander-v3")},
}


ON_POLICY = {"ppo", "a2c"}
"""Run with ``buffer=on_policy`` here (each rollout from the newest weights), as SB3 runs them; the
presets generate one version ahead (``buffer=one_ahead``) to overlap generation with training,
which trades sample efficiency for wall time (``--one-ahead`` keeps the presets' setting)."""


def _schedule(value):
    """rl-zoo's ``lin_X``: linear decay from X to 0 over training."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_left: progress_left * start
    return value


def sb3_main(algo: str, env_id: str, seed: int, steps: int, out: str) -> None:
    """Child process: train SB3 with the zoo hyperparameters, save the model (and VecNormalize stats)."""
    from stable_baselines3 import A2C, DQN, PPO  # the bench extra: optional, imported only where SB3 runs
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    hp = dict(GYM[(algo, env_id)][2])
    normalize, n_envs = hp.pop("normalize", False), hp.pop("n_envs", 1)
    hp = {k: _schedule(v) for k, v in hp.items()}
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        env = VecNormalize(env, gamma=hp.get("gamma", 0.99))
    cls = {"ppo": PPO, "a2c": A2C, "dqn": DQN}[algo]
    model = cls("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **hp)
    model.learn(total_timesteps=steps)
    model.save(os.path.join(out, "model"))
    if normalize:
        env.save(os.path.join(out, "vecnormalize.pkl"))


def eval_sb3(algo: str, env_id: str, out: str, episodes: int) -> list[float]:
    from stable_baselines3 import A2C, DQN, PPO  # the bench extra: optional, imported only where SB3 runs

    model = {"ppo": PPO, "a2c": A2C, "dqn": DQN}[algo].load(os.path.join(out, "model"), device="cpu")
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


def eval_rlmesh(algo: str, env_id: str, run_dir: str, episodes: int) -> list[float]:
    ckpt = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "step_*.pt")))[-1]
    obs_space, act_space = env_spaces(env_id)
    policy = QNetwork(obs_space, act_space) if algo == "dqn" else ActorCritic(obs_space, act_space)
    policy.load_state_dict(torch.load(ckpt, weights_only=False)["model"])
    return evaluate_greedy(greedy_actor(policy, act_space), env_id, episodes, seed=10_000)[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("RLMESH_START_TIMEOUT_S", "600")  # a loaded machine must slow a run down, not fail it
    return env


def run_rlmesh(algo: str, env_id: str, seed: int, steps: int, episodes: int, one_ahead: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="algos-rlmesh-") as tmp:
        on_policy = ["buffer=on_policy"] if algo in ON_POLICY and not one_ahead else []
        args = [sys.executable, "-m", "rlmesh.cli", "run", *GYM[(algo, env_id)][1], *on_policy,
                f"trainer.total_steps={steps}",
                f"run.seed={seed}", f"generator.seed={seed}", "eval.every=0", "eval.target=null", "eval.episodes=10",
                "run.progress=false", "trainer.checkpoint_every=0"]
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
    return f"{statistics.mean(xs):8.1f} ± {statistics.pstdev(xs):5.1f}"


def gym_table(args: argparse.Namespace) -> None:
    print("| algo | env | steps | seed | rlmesh return | rlmesh wall s | SB3 return | SB3 wall s |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[tuple[str, str], dict[str, list]] = {}
    for algo in args.algos:
        for env_id in args.envs:
            if (algo, env_id) not in GYM:
                continue
            steps = int(GYM[(algo, env_id)][0] * args.scale)
            for seed in args.seeds:  # interleaved: rlmesh then SB3 per seed
                r = run_rlmesh(algo, env_id, seed, steps, args.episodes, args.one_ahead)
                s = run_sb3(algo, env_id, seed, steps, args.episodes)
                acc = summary.setdefault((algo, env_id), {"r": [], "s": [], "rw": [], "sw": []})
                acc["r"].append(statistics.mean(r["returns"]))
                acc["s"].append(statistics.mean(s["returns"]))
                acc["rw"].append(r["wall_s"])
                acc["sw"].append(s["wall_s"])
                print(f"| {algo} | {env_id} | {steps} | {seed} | {_ms(r['returns'])} | {r['wall_s']:6.1f} | "
                      f"{_ms(s['returns'])} | {s['wall_s']:6.1f} |", flush=True)
    print("\nSummary (mean ± std over seeds of each seed's mean greedy return; wall time mean over seeds)\n")
    print("| algo | env | rlmesh return | SB3 return | rlmesh wall s | SB3 wall s | wall ratio |")
    print("|---|---|---|---|---|---|---|")
    for (algo, env_id), a in summary.items():
        ratio = statistics.mean(a["rw"]) / statistics.mean(a["sw"])
        print(f"| {algo} | {env_id} | {_ms(a['r'])} | {_ms(a['s'])} | {statistics.mean(a['rw']):.1f} | "
              f"{statistics.mean(a['sw']):.1f} | {ratio:.2f} |")


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
    p.add_argument("--algos", nargs="+", default=["ppo", "a2c", "dqn"])
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "LunarLander-v3"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--scale", type=float, default=1.0, help="multiply every env-step budget (reduced runs)")
    p.add_argument("--one-ahead", action="store_true",
                   help="PPO/A2C as the presets run them (one version ahead), not strictly on-policy as SB3")
    p.add_argument("--episodes", type=int, default=10, help="greedy evaluation episodes per seed (>= 10)")
    p.add_argument("--llm", action="store_true", help="also (or with --no-gym, only) the LLM table")
    p.add_argument("--no-gym", action="store_true")
    p.add_argument("--llm-steps", type=int, default=400)
    p.add_argument("--llm-args", nargs="*", default=[], help="extra overrides for the four LLM recipes")
    args = p.parse_args()
    banner("algorithms: rlmesh vs Stable-Baselines3 (rl-zoo hyperparameters), same env steps", "torch", "gymnasium",
           "stable-baselines3")
    print(f"# load average at start: {os.getloadavg()}")
    if not args.no_gym:
        gym_table(args)
    if args.llm:
        llm_table(args)
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
