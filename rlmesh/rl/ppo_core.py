"""The reference PPO loop, single process, built from the blocks the actors use.

Split the way the distributed recipe splits it:

- :class:`~rlmesh.rl.rollout.RolloutCollector` is the body of ``GymGenerator``: it steps
  a gymnasium vector env with an :class:`~rlmesh.rl.models.ActorCritic` and returns a
  :class:`~rlmesh.rl.rollout.Rollout`.
- :func:`ppo_update` is the body of ``PPOTrainer.train_step``: GAE, then minibatch
  epochs of :func:`~rlmesh.rl.losses.ppo_loss`.
- :func:`~rlmesh.rl.rollout.evaluate_greedy` is the eval step (fresh envs, greedy policy).
- :func:`train_ppo` wires them together in-process; it is the baseline the distributed
  recipe must match, and what ``benchmarks/cartpole_vs_sb3.py`` times.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlmesh.rl.config import GymGeneratorConfig, PPOConfig
from rlmesh.rl.losses import compute_gae, ppo_loss
from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig
from rlmesh.rl.rollout import Rollout, RolloutCollector, evaluate_greedy, greedy_actor

logger = logging.getLogger(__name__)


def rollout_advantages(rollout: Rollout, gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over a :class:`Rollout`; ``next_values`` are the next step's values (NEXT_STEP autoreset)."""
    next_values = torch.cat([rollout.values[1:], rollout.last_value.unsqueeze(0)])
    return compute_gae(rollout.rewards, rollout.values, next_values, rollout.terminated, rollout.dones,
                       gamma, gae_lambda)


def ppo_update(
    policy: ActorCritic,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    config: PPOConfig,
    clip_coef: float | None = None,
    generator: torch.Generator | None = None,
    advantages_fn: Callable[[Rollout], tuple[torch.Tensor, torch.Tensor]] | None = None,
    loss_fn: Callable[..., Any] | None = None,
) -> dict[str, float]:
    """One PPO train step on a rollout: advantages, then ``update_epochs`` of minibatches.

    Returns the last minibatch's ``losses/*`` metrics plus ``losses/explained_variance``
    and ``train/minibatch_updates``. ``clip_coef`` overrides ``config.clip_coef`` (for annealing).
    ``advantages_fn(rollout) -> (advantages, returns)`` (``[T, N]`` each) and ``loss_fn`` (same
    arguments and result as :func:`~rlmesh.rl.losses.ppo_loss`) replace the defaults: they are
    ``PPOTrainer``'s ``compute_advantages`` / ``compute_loss`` hooks.
    """
    clip = config.clip_coef if clip_coef is None else clip_coef
    loss_fn = loss_fn or ppo_loss
    with torch.no_grad():
        if advantages_fn is None:
            advantages, returns = rollout_advantages(rollout, config.gamma, config.gae_lambda)
        else:
            advantages, returns = advantages_fn(rollout)
    keep = rollout.valid.reshape(-1)
    obs = rollout.obs.reshape(-1, *rollout.obs.shape[2:])[keep]
    actions = rollout.actions.reshape(-1, *rollout.actions.shape[2:])[keep]
    old_logp, old_values = rollout.logprobs.reshape(-1)[keep], rollout.values.reshape(-1)[keep]
    advantages, returns = advantages.reshape(-1)[keep], returns.reshape(-1)[keep]
    batch = obs.shape[0]
    mb_size = max(1, batch // config.num_minibatches)
    updates, out = 0, None
    for _ in range(config.update_epochs):
        order = torch.randperm(batch, generator=generator) if mb_size < batch else None
        for start in range(0, batch - mb_size + 1, mb_size):
            idx = order[start:start + mb_size] if order is not None else slice(None)
            logp, entropy, values = policy.evaluate(obs[idx], actions[idx])
            out = loss_fn(logp, old_logp[idx], advantages[idx], values, old_values[idx], returns[idx], entropy,
                           clip_coef=clip, value_clip_coef=config.value_clip_coef, value_coef=config.value_coef,
                           entropy_coef=config.entropy_coef, normalize_advantages=config.normalize_advantages)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            optimizer.step()
            updates += 1
        if config.target_kl is not None and out is not None and out.approx_kl > config.target_kl:
            break
    metrics = out.metrics() if out is not None else {}
    var = returns.var()
    metrics["losses/explained_variance"] = float(1 - (returns - old_values).var() / var) if var > 0 else float("nan")
    metrics["train/minibatch_updates"] = float(updates)
    return metrics


def make_optimizer(policy: torch.nn.Module, config: PPOConfig) -> torch.optim.Adam:
    """Adam, fused where the build supports it: on CPU that is ~20% off a small-MLP update."""
    try:
        return torch.optim.Adam(policy.parameters(), lr=config.lr, eps=config.adam_eps, fused=True)
    except (RuntimeError, TypeError):  # older builds or devices without a fused kernel
        return torch.optim.Adam(policy.parameters(), lr=config.lr, eps=config.adam_eps)


@dataclass
class TrainResult:
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
) -> TrainResult:
    """Train PPO in-process; evaluate greedily every ``eval_every`` env steps.

    Stops at ``ppo.total_steps`` or as soon as an evaluation reaches ``target_return``.
    """
    torch.manual_seed(seed)
    collector_envs = gym.make_vec(generator.env_id, num_envs=1)
    policy = ActorCritic(collector_envs.single_observation_space, collector_envs.single_action_space, model)
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
    return TrainResult(evals, solved_steps, solved_seconds, solved_total, policy)
