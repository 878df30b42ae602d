"""The reference PPO loop, single process, built from the blocks the actors use.

Split the way the distributed recipe splits it:

- :class:`RolloutCollector` is the body of ``GymGenerator``: it steps a gymnasium vector
  env with an :class:`~rlmesh.rl.models.ActorCritic` and returns a :class:`Rollout`.
- :func:`ppo_update` is the body of ``PPOTrainer.train_step``: GAE, then minibatch
  epochs of :func:`~rlmesh.rl.losses.ppo_loss`.
- :func:`evaluate_greedy` is the eval step (fresh envs, greedy policy).
- :func:`train_ppo` wires them together in-process; it is the baseline the distributed
  recipe must match, and what ``benchmarks/cartpole_vs_sb3.py`` times.

Autoreset: gymnasium >= 1.0 vector envs reset an episode on the step *after* it ends
(``NEXT_STEP``). That step's transition is not real (its action is ignored, reward 0), so
the collector marks it ``valid = False`` and it is dropped from the loss; the observation
returned on the done step is the real final one, which makes truncation bootstrap free.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from rlmesh.rl.config import GymGeneratorConfig, PPOConfig
from rlmesh.rl.losses import compute_gae, ppo_loss
from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig

logger = logging.getLogger(__name__)


def make_vec_env(env_id: str, num_envs: int, seed: int | None = None) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """A gymnasium vector env (native vectorisation when the env has one) and its first obs."""
    envs = gym.make_vec(env_id, num_envs=num_envs)
    mode = envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
    if mode != gym.vector.AutoresetMode.NEXT_STEP:
        raise ValueError(f"{env_id}: autoreset_mode {mode} is not supported yet; use NEXT_STEP (the default)")
    obs, _ = envs.reset(seed=seed)
    return envs, obs


@dataclass
class Rollout:
    """``num_steps x num_envs`` transitions from one policy version; tensors are [T, N]."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    dones: torch.Tensor
    valid: torch.Tensor
    """False on the autoreset step that follows each episode end (not a real transition)."""
    last_value: torch.Tensor
    """V(s_T) of the observation after the last step, [N], for the bootstrap."""
    policy_version: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        """Real env transitions in this rollout (autoreset steps excluded)."""
        return int(self.valid.sum())


class RolloutCollector:
    """Steps a vector env with a policy; keeps env state (and open episodes) across calls."""

    def __init__(self, config: GymGeneratorConfig, policy: ActorCritic, seed: int | None = None) -> None:
        self.config = config
        self.policy = policy
        self.envs, obs = make_vec_env(config.env_id, config.num_envs, config.seed if seed is None else seed)
        self._obs = torch.as_tensor(obs, dtype=torch.float32)
        self._prev_done = np.zeros(config.num_envs, dtype=bool)
        self._ep_return = np.zeros(config.num_envs)
        self._ep_length = np.zeros(config.num_envs, dtype=np.int64)
        self._action_space = self.envs.single_action_space
        self.total_steps = 0
        """Real env transitions collected so far (what "env steps" means in benchmarks)."""

    def collect(self, policy_version: int = 0) -> Rollout:
        """Run ``num_steps`` vector steps with the current policy."""
        t_max, n = self.config.num_steps, self.config.num_envs
        obs_buf = torch.empty((t_max, n, *self._obs.shape[1:]))
        act_buf = torch.empty((t_max, n, *self.policy.action_shape), dtype=torch.long if self.policy.discrete else torch.float32)
        logp_buf, val_buf, rew_buf = torch.empty(t_max, n), torch.empty(t_max, n), torch.empty(t_max, n)
        term_buf = torch.empty(t_max, n)
        done_buf = torch.empty(t_max, n)
        valid_buf = torch.empty(t_max, n, dtype=torch.bool)
        returns, lengths = [], []
        for t in range(t_max):
            actions, logp, value = self.policy.act(self._obs)
            obs_buf[t], act_buf[t], logp_buf[t], val_buf[t] = self._obs, actions, logp, value
            env_actions = actions.numpy()
            if not self.policy.discrete:
                env_actions = np.clip(env_actions, self._action_space.low, self._action_space.high)
            obs, reward, terminated, truncated, _ = self.envs.step(env_actions)
            valid = ~self._prev_done
            done = terminated | truncated
            rew_buf[t] = torch.from_numpy(np.asarray(reward, dtype=np.float32))
            term_buf[t] = torch.from_numpy(terminated.astype(np.float32))
            done_buf[t] = torch.from_numpy(done.astype(np.float32))
            valid_buf[t] = torch.from_numpy(valid)
            self._ep_return += np.where(valid, reward, 0.0)
            self._ep_length += valid
            for i in np.flatnonzero(done & valid):
                returns.append(float(self._ep_return[i]))
                lengths.append(int(self._ep_length[i]))
            self._ep_return[done] = 0.0
            self._ep_length[done] = 0
            self._prev_done = done
            self._obs = torch.as_tensor(obs, dtype=torch.float32)
        last_value = self.policy.value(self._obs).detach() if t_max else torch.zeros(n)
        rollout = Rollout(obs_buf, act_buf, logp_buf, val_buf, rew_buf, term_buf, done_buf, valid_buf,
                          last_value, policy_version, returns, lengths)
        self.total_steps += rollout.num_steps
        return rollout

    def close(self) -> None:
        self.envs.close()


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
) -> dict[str, float]:
    """One PPO train step on a rollout: advantages, then ``update_epochs`` of minibatches.

    Returns the last minibatch's ``losses/*`` metrics plus ``losses/explained_variance``
    and ``train/minibatch_updates``. ``clip_coef`` overrides ``config.clip_coef`` (for annealing).
    """
    clip = config.clip_coef if clip_coef is None else clip_coef
    with torch.no_grad():
        advantages, returns = rollout_advantages(rollout, config.gamma, config.gae_lambda)
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
            out = ppo_loss(logp, old_logp[idx], advantages[idx], values, old_values[idx], returns[idx], entropy,
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


def evaluate_greedy(
    act: Callable[[np.ndarray], np.ndarray], env_id: str, num_episodes: int = 20, seed: int = 10_000
) -> tuple[float, list[float]]:
    """Mean return of ``num_episodes`` episodes, one per env of a fresh vector env, run together.

    ``act`` maps a batch of observations to a batch of actions (any framework's greedy
    policy fits, which is how the SB3 benchmark shares this exact protocol).
    """
    envs = gym.make_vec(env_id, num_envs=num_episodes)
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(num_episodes)
    running = np.ones(num_episodes, dtype=bool)
    while running.any():
        obs, reward, terminated, truncated, _ = envs.step(act(obs))
        returns += np.where(running, reward, 0.0)
        running &= ~(terminated | truncated)
    envs.close()
    return float(returns.mean()), returns.tolist()


def greedy_actor(policy: ActorCritic) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap a policy as ``obs -> greedy actions`` for :func:`evaluate_greedy`."""
    space_clip: Callable[[np.ndarray], np.ndarray] = lambda a: a  # noqa: E731

    def act(obs: np.ndarray) -> np.ndarray:
        actions, _, _ = policy.act(torch.as_tensor(obs, dtype=torch.float32), greedy=True)
        return space_clip(actions.numpy())

    return act


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
            mean_return, _ = evaluate_greedy(greedy_actor(policy), generator.env_id, eval_episodes, seed + 10_000)
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
