"""The reference PPO loop, single process, built from the blocks the actors use.

Split the way the distributed recipe splits it:

- :class:`~rlmesh.rl.rollout.RolloutCollector` is the body of ``GymGenerator``: it steps
  a gymnasium vector env with an :class:`~rlmesh.rl.models.ActorCritic` and returns a
  :class:`~rlmesh.rl.rollout.Rollout`.
- :func:`~rlmesh.rl.algorithms.ppo.ppo_update` is the body of ``PPOTrainer.train_step``: GAE,
  then minibatch epochs of :func:`~rlmesh.rl.algorithms.ppo.ppo_loss` (the maths, top to bottom,
  is :mod:`rlmesh.rl.algorithms.ppo`).
- :func:`~rlmesh.rl.rollout.evaluate_greedy` is the eval step (fresh envs, greedy policy).
- :func:`train_ppo` wires them together in-process; it is the baseline the distributed
  recipe must match, and what ``benchmarks/cartpole_vs_sb3.py`` times.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from rlmesh.rl.config import GymGeneratorConfig, PPOConfig
from rlmesh.rl.algorithms.ppo import build_policy, make_optimizer, ppo_update, rollout_advantages
from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig
from rlmesh.rl.rollout import RolloutCollector, evaluate_greedy, greedy_actor

__all__ = ["PPORunResult", "make_optimizer", "ppo_update", "rollout_advantages", "train_ppo"]

logger = logging.getLogger(__name__)


@dataclass
class PPORunResult:
    """What :func:`train_ppo` reports: the eval curve and when the target was first hit."""

    evals: list[tuple[int, float, float]]
    """``(env_steps, wall_seconds_excluding_eval, mean_return)`` per evaluation."""
    solved_steps: int | None
    solved_seconds: float | None
    """Wall-clock training seconds to first reach the target (eval time excluded)."""
    solved_seconds_total: float | None
    """The same including the time spent evaluating."""
    policy: ActorCritic


def train_ppo(
    generator: GymGeneratorConfig,
    ppo: PPOConfig,
    model: ActorCriticConfig | None = None,
    seed: int = 0,
    eval_every: int = 2048,
    eval_episodes: int = 20,
    target_return: float | None = None,
) -> PPORunResult:
    """Train PPO in-process; evaluate greedily every ``eval_every`` env steps.

    Stops at ``ppo.total_steps`` or as soon as an evaluation reaches ``target_return``.
    """
    torch.manual_seed(seed)
    collector_envs = gym.make_vec(generator.env_id, num_envs=1)
    policy = build_policy(collector_envs.single_observation_space, collector_envs.single_action_space, model, ppo)
    collector_envs.close()
    collector = RolloutCollector(generator, policy, seed=seed)
    optimizer = make_optimizer(policy, ppo)
    shuffle = torch.Generator().manual_seed(seed)
    evals: list[tuple[int, float, float]] = []
    solved_steps = solved_seconds = solved_total = None
    next_eval, eval_seconds, version = eval_every, 0.0, 0
    start = time.perf_counter()
    while collector.total_steps < ppo.total_steps:
        frac = max(0.0, 1.0 - collector.total_steps / ppo.total_steps)
        if ppo.anneal_lr:
            optimizer.param_groups[0]["lr"] = ppo.lr * frac
        rollout = collector.collect(policy_version=version)
        metrics = ppo_update(policy, optimizer, rollout, ppo, ppo.clip_coef * frac if ppo.anneal_clip else None,
                             shuffle)
        version += 1
        if rollout.episode_returns:
            metrics["charts/episodic_return"] = float(np.mean(rollout.episode_returns))
        if collector.total_steps >= next_eval:
            next_eval += eval_every
            t0 = time.perf_counter()
            act = greedy_actor(policy, collector.envs.single_action_space)
            mean_return, _ = evaluate_greedy(act, generator.env_id, eval_episodes, seed + 10_000)
            eval_seconds += time.perf_counter() - t0
            train_seconds = time.perf_counter() - start - eval_seconds
            evals.append((collector.total_steps, train_seconds, mean_return))
            logger.info("step %d eval/mean_return %.1f charts/SPS %.0f %s", collector.total_steps, mean_return,
                        collector.total_steps / max(train_seconds, 1e-9), metrics)
            if target_return is not None and mean_return >= target_return:
                solved_steps, solved_seconds = collector.total_steps, train_seconds
                solved_total = time.perf_counter() - start
                break
    collector.close()
    return PPORunResult(evals, solved_steps, solved_seconds, solved_total, policy)
