"""``GymGenerator``: steps a gymnasium vector env (any registered id, discrete or continuous
actions) with an MLP actor-critic and ships trajectories with log-probs and values.

The body is :class:`rlmesh.rl.rollout.RolloutCollector`, the same code the single-process
reference PPO runs; this actor adds the weight version, the work id and telemetry.
The same class serves as the **evaluator** (``buffer=None``): :meth:`evaluate` runs the
greedy policy on fresh envs and writes an ``evals`` row.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlmesh as rm
from rlmesh.rl.actors.generator import Generator
from rlmesh.rl.config import GymGeneratorConfig
from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig
from rlmesh.rl.results import EvalResult
from rlmesh.rl.rollout import RolloutCollector, evaluate_greedy, greedy_actor
from rlmesh.rl.run.schedule import WorkItem


def env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """Single-env observation and action spaces of ``env_id`` (the policy is built from them)."""
    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def mean_return(rollout: Any) -> float | None:
    """The mean return of the episodes that ended in ``rollout`` (``None``: none did)."""
    return float(np.mean(rollout.episode_returns)) if rollout.episode_returns else None


def record_rollout(rollout_id: str, rollout: Any, version: int, env_id: str, duration_s: float) -> None:
    """The ``rollouts`` row of one gym rollout: a generator's, or a trainer's that collects its own."""
    rm.telemetry.record("rollouts", rollout_id=rollout_id, policy_version=version, reward=mean_return(rollout),
                        length=rollout.num_steps, env=env_id, duration_s=duration_s,
                        episodes=len(rollout.episode_returns), samples=rollout.num_steps)


class GymGenerator(Generator):
    """Collects ``num_envs x num_steps`` transitions per work item.

    Replica ``i`` of the mesh seeds its envs, and its proc's torch and numpy random generators (action
    sampling, exploration noise, epsilon-greedy draws), with ``config.seed + 1000 * i``: so a run's
    seed fixes what its generators draw, and a strictly on-policy run (``buffer.max_policy_lag=0``)
    repeats exactly, as the same loop in one process does (``benchmarks/algorithms.py --core``).
    """

    def __init__(self, config: GymGeneratorConfig, buffer: Any = None, model: ActorCriticConfig | None = None,
                 weights: str = "policy") -> None:
        super().__init__(buffer, weights)
        self.config = config
        obs_space, act_space = env_spaces(config.env_id)
        self.policy = self.build_policy(obs_space, act_space, model)
        self.action_space = act_space
        self.collector: RolloutCollector | None = None
        if buffer is not None:
            seed = config.seed + 1000 * max(rm.context().rank, 0)
            torch.manual_seed(seed)  # the fork template left fresh entropy here (launch/fork_template.py)
            np.random.seed(seed % 2**32)
            self.collector = RolloutCollector(config, self.policy, seed=seed)

    def build_policy(self, observation_space: gym.Space, action_space: gym.Space,
                     model: ActorCriticConfig | None) -> torch.nn.Module:
        """Hook: the network that acts (its ``state_dict`` must match the trainer's model). Default:
        :class:`~rlmesh.rl.models.mlp.ActorCritic`; DQN's generator returns its Q-network."""
        return ActorCritic(observation_space, action_space, model)

    def weight_target(self) -> Any:
        return self.policy

    @rm.endpoint
    def collect(self, item: WorkItem) -> dict[str, Any]:
        """Pull weights >= ``item.min_version``, collect one rollout, hand it to the buffer.

        Returns a small summary for the controller (the rollout itself goes to the buffer).
        A ``rollouts`` telemetry row is written only for rollouts the buffer accepted, so
        the table never counts re-issued work twice.
        """
        if self.collector is None:
            raise RuntimeError("this GymGenerator was built without a buffer (an evaluator); it cannot collect")
        self.sync_weights(item.min_version)
        t0 = time.perf_counter()
        rollout = self.collector.collect(policy_version=self.version)
        refused = self.submit(item.work_id, rollout, rollout.num_steps)
        accepted = not refused
        if accepted:
            record_rollout(item.work_id, rollout, self.version, self.config.env_id, time.perf_counter() - t0)
        return {"rollout_id": item.work_id, "policy_version": self.version, "accepted": accepted, "reason": refused,
                "samples": rollout.num_steps, "episodes": len(rollout.episode_returns),
                "mean_return": mean_return(rollout)}

    @rm.endpoint
    def evaluate(self, episodes: int = 20, min_version: int = 0, env_steps: int | None = None,
                 seed: int = 10_000) -> EvalResult:
        """Greedy mean return over ``episodes`` fresh envs (one episode each) with the newest
        weights >= ``min_version``; writes an ``evals`` row (``metric='mean_return'``), once per version."""
        def measure() -> tuple[str, float, int]:
            mean_return, _ = evaluate_greedy(greedy_actor(self.policy, self.action_space), self.config.env_id,
                                             episodes, seed)
            return "mean_return", mean_return, episodes

        return self.evaluation(min_version, env_steps, measure)

    def on_stop(self) -> None:
        if self.collector is not None:
            self.collector.close()
        super().on_stop()
