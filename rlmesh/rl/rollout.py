"""Rollout collection from gymnasium vector envs: the body of ``GymGenerator``.

:class:`RolloutCollector` steps a vector env with an
:class:`~rlmesh.rl.models.ActorCritic` and returns a :class:`Rollout` tagged with the
policy version that produced it; :func:`evaluate_greedy` runs the eval protocol (fresh
envs, greedy policy, one episode per env, all in lockstep).

Autoreset: gymnasium >= 1.0 vector envs reset an episode on the step *after* it ends
(``NEXT_STEP``). That step's transition is not real (its action is ignored, reward 0), so
the collector marks it ``valid = False`` and the trainer drops it; the observation
returned on the done step is the real final one, which makes the truncation bootstrap
free (see :func:`rlmesh.rl.algorithms.ppo.compute_gae`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from rlmesh.rl.config import GymGeneratorConfig
from rlmesh.rl.models.mlp import ActorCritic


def make_vec_env(
    env_id: str, num_envs: int, seed: int | None = None, vectorization: str = "auto"
) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """A gymnasium vector env and its first observation (see ``GymGeneratorConfig.vectorization``)."""
    envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=None if vectorization == "auto" else vectorization)
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
    last_obs: torch.Tensor | None = None
    """The raw observation after the last step, [N, ...]: the next state of step ``T - 1``
    (off-policy algorithms build ``(s, a, r, s')`` transitions from ``obs`` and this)."""
    discounted_returns: torch.Tensor | None = None
    """The running discounted return ``G_t = r_t + gamma * G_{t-1}`` at each step ([T, N]), carried
    across rollouts and reset at episode ends, with the ``reward_gamma`` the trainer's weights hold;
    ``None`` while the trainer does not scale rewards. Its spread is what rewards are divided by."""

    @property
    def num_steps(self) -> int:
        """Real env transitions in this rollout (autoreset steps excluded)."""
        return int(self.valid.sum())


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """Join rollouts from several generator replicas along the env axis (one train batch).

    They must have the same ``num_steps`` and policy version (the buffer's
    ``max_policy_lag=0`` guarantees the latter for on-policy PPO); the result's version is
    the oldest, so the trainer's reported lag is never understated.
    """
    if not rollouts:
        raise ValueError("concat_rollouts: need at least one rollout")
    steps = {r.obs.shape[0] for r in rollouts}
    if len(steps) != 1:
        raise ValueError(f"concat_rollouts: rollouts have different num_steps {sorted(steps)}; use one generator.num_steps")
    cat = lambda name: torch.cat([getattr(r, name) for r in rollouts], dim=1)  # noqa: E731
    return Rollout(  # type: ignore[misc]  # the eight tensors fill the eight leading fields
        *(cat(k) for k in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "dones", "valid")),
        last_value=torch.cat([r.last_value for r in rollouts]),
        policy_version=min(r.policy_version for r in rollouts),
        episode_returns=[x for r in rollouts for x in r.episode_returns],
        episode_lengths=[x for r in rollouts for x in r.episode_lengths],
        last_obs=None if any(r.last_obs is None for r in rollouts) else torch.cat([r.last_obs for r in rollouts]),
        discounted_returns=None if any(r.discounted_returns is None for r in rollouts) else cat("discounted_returns"),
    )


class RolloutCollector:
    """Steps a vector env with a policy; keeps env state (and open episodes) across calls."""

    def __init__(self, config: GymGeneratorConfig, policy: ActorCritic, seed: int | None = None) -> None:
        self.config = config
        self.policy = policy
        self.envs, obs = make_vec_env(config.env_id, config.num_envs, config.seed if seed is None else seed,
                                      config.vectorization)
        self._obs = torch.as_tensor(obs, dtype=torch.float32)
        self._prev_done = np.zeros(config.num_envs, dtype=bool)
        self._ep_return = np.zeros(config.num_envs)
        self._ep_length = np.zeros(config.num_envs, dtype=np.int64)
        self._disc_return = np.zeros(config.num_envs)
        """Running discounted return per env, carried across ``collect`` calls (for reward scaling)."""
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
        gamma = float(getattr(self.policy, "reward_gamma", 0.0))
        disc_buf = torch.empty(t_max, n) if gamma > 0 else None
        reset_noise = getattr(self.policy, "reset_noise", None)
        if reset_noise is not None:  # gSDE: new exploration matrices at each rollout's start
            reset_noise(n)
        for t in range(t_max):
            actions, logp, value = self.policy.act(self._obs)
            obs_buf[t], act_buf[t], logp_buf[t], val_buf[t] = self._obs, actions, logp, value
            env_actions = actions.numpy() if self.policy.discrete else self.policy.env_actions(actions)
            obs, reward, terminated, truncated, _ = self.envs.step(env_actions)
            valid = ~self._prev_done
            done = terminated | truncated
            rew_buf[t] = torch.from_numpy(np.asarray(reward, dtype=np.float32))
            term_buf[t] = torch.from_numpy(terminated.astype(np.float32))
            done_buf[t] = torch.from_numpy(done.astype(np.float32))
            valid_buf[t] = torch.from_numpy(valid)
            self._ep_return += np.where(valid, reward, 0.0)
            if disc_buf is not None:  # as SB3's VecNormalize: G = gamma * G + r, reset after an episode ends
                self._disc_return = np.where(valid, gamma * self._disc_return + reward, 0.0)
                disc_buf[t] = torch.from_numpy(self._disc_return.astype(np.float32))
                self._disc_return[done] = 0.0
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
                          last_value, policy_version, returns, lengths, self._obs.clone(), disc_buf)
        self.total_steps += rollout.num_steps
        return rollout

    def close(self) -> None:
        self.envs.close()


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


def greedy_actor(policy: ActorCritic, action_space: gym.Space | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap a policy as ``obs -> greedy actions`` for :func:`evaluate_greedy`.

    Pass the single-env ``action_space`` for ``Box`` actions so the mean is clipped (or, with
    ``squash``, tanh-squashed) into the bounds, as in training (:meth:`ActorCritic.env_actions`).
    """
    box = isinstance(action_space, gym.spaces.Box)

    def act(obs: np.ndarray) -> np.ndarray:
        actions, _, _ = policy.act(torch.as_tensor(obs, dtype=torch.float32), greedy=True)
        return policy.env_actions(actions) if box else actions.numpy()

    return act
