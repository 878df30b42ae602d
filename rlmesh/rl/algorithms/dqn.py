"""DQN (Mnih et al., 2015), top to bottom: Q-network, exploration, TD target, loss, update.

The off-policy value method, and the test of whether rlmesh's actor/buffer design serves more
than PPO. What differs from the on-policy recipes, and where it lives:

- **Replay**: generators add rollouts to a :class:`~rlmesh.rl.actors.transition_buffer.TransitionBuffer`
  (``buffer=replay``), a ring of transitions sampled uniformly, old data included;
- **Update-to-data ratio**: every ``train`` call waits for the generators' next batch of
  rollouts (``replicas x num_envs x num_steps`` env steps), then takes ``gradient_steps``
  minibatch steps: the ratio is ``gradient_steps / env steps per batch``, set by the recipe;
- **Target network**: a frozen copy of the Q-network for the bootstrap, synced every
  ``target_update_every`` gradient steps (``tau=1``: a copy; ``tau<1``: Polyak averaging);
- **Exploration**: epsilon-greedy; epsilon is a buffer of the Q-network, set by the trainer from
  its schedule, so it travels to the generators with the weights.

The maths (:func:`td_targets`, :func:`dqn_loss`, :func:`dqn_update`) is pure tensors; the
generator (:class:`DQNGenerator`) and trainer (:class:`DQNTrainer`) actors come last.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import rlmesh as rm
from rlmesh.rl.algorithms.configs import DQNConfig
from rlmesh.rl.actors.gym_generator import GymGenerator, env_spaces
from rlmesh.rl.actors.trainer import Trainer
from rlmesh.rl.models.mlp import _ACTIVATIONS, ActorCriticConfig
from rlmesh.rl.replay import ReplaySample, Transitions
from rlmesh.rl.results import TrainResult

# -- the Q-network -----------------------------------------------------------------------------------------------


class QNetwork(nn.Module):
    """An MLP from a flat observation to one Q-value per discrete action, acting epsilon-greedily.

    It speaks the policy interface :class:`~rlmesh.rl.rollout.RolloutCollector` steps envs with
    (``act`` -> actions, log-probs, values; ``value``; ``discrete``; ``action_shape``), so the
    gym generator runs it unchanged; log-probs are 0 (unused off-policy) and the value is max Q.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: ActorCriticConfig | None = None) -> None:
        super().__init__()
        config = config or ActorCriticConfig(hidden_sizes=(256, 256), activation="relu")
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"DQN needs a Discrete action space, got {action_space}; use trainer=ppo or a2c")
        sizes = [int(np.prod(observation_space.shape)), *config.hidden_sizes, int(action_space.n)]  # type: ignore[arg-type]  # a Box space has a shape, checked by env_spaces
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(_ACTIVATIONS[config.activation]())
        self.q = nn.Sequential(*layers)
        self.register_buffer("epsilon", torch.tensor(1.0))
        self.discrete, self.action_shape, self.num_actions = True, (), int(action_space.n)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(s, .), shape [B, num_actions]."""
        return self.q(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs).max(-1).values

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """argmax Q, or with probability ``epsilon`` (not ``greedy``) a uniform random action."""
        q = self.q(obs)
        actions = q.argmax(-1)
        if not greedy:
            explore = torch.rand(actions.shape[0]) < self.epsilon
            actions = torch.where(explore, torch.randint(self.num_actions, actions.shape), actions)
        return actions, torch.zeros(actions.shape[0]), q.max(-1).values


def linear_epsilon(env_steps: int, total_steps: int, fraction: float, start: float, end: float) -> float:
    """Epsilon decays linearly from ``start`` to ``end`` over the first ``fraction`` of the budget."""
    span = max(1.0, fraction * total_steps)
    return end + (start - end) * max(0.0, 1.0 - env_steps / span)


# -- TD target, loss, update -------------------------------------------------------------------------------------


def td_targets(target_net: nn.Module, batch: Transitions, gamma: float) -> torch.Tensor:
    """``y = r + gamma * (1 - terminated) * max_a' Q_target(s', a')`` (no gradient).

    Truncated episodes keep their bootstrap: only ``terminated`` means there is no future.
    """
    with torch.no_grad():
        next_q = target_net(batch.next_obs).max(-1).values
        return batch.rewards + gamma * (1.0 - batch.terminated.float()) * next_q


def dqn_loss(q_net: nn.Module, batch: Transitions, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Huber loss between ``Q(s, a)`` and the TD targets; returns ``(loss, Q(s, a))``."""
    q = q_net(batch.obs).gather(-1, batch.actions.long().reshape(-1, 1)).squeeze(-1)
    return nn.functional.smooth_l1_loss(q, targets), q


@torch.no_grad()
def soft_update(target_net: nn.Module, q_net: nn.Module, tau: float) -> None:
    """``target <- tau * online + (1 - tau) * target`` (``tau=1``: a hard copy)."""
    for t, o in zip(target_net.parameters(), q_net.parameters()):
        t.lerp_(o, tau)


def dqn_update(q_net: nn.Module, target_net: nn.Module, optimizer: torch.optim.Optimizer, batch: Transitions,
               config: DQNConfig, gradient_steps_done: int = 0) -> dict[str, float]:
    """``len(batch) / config.batch_size`` gradient steps, one per consecutive minibatch of ``batch``
    (the buffer already drew it uniformly), syncing the target every ``target_update_every`` steps
    counted from ``gradient_steps_done``."""
    loss = q = None
    steps = len(batch) // config.batch_size
    for k in range(steps):
        mb = batch[slice(k * config.batch_size, (k + 1) * config.batch_size)]
        loss, q = dqn_loss(q_net, mb, td_targets(target_net, mb, config.gamma))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(q_net.parameters(), config.max_grad_norm)
        optimizer.step()
        if (gradient_steps_done + k + 1) % config.target_update_every == 0:
            soft_update(target_net, q_net, config.tau)
    if loss is None or q is None:
        return {"train/gradient_steps": 0.0}
    return {"losses/loss": float(loss.detach()), "losses/q_mean": float(q.detach().mean()),
            "train/gradient_steps": float(steps)}


# -- actors ----------------------------------------------------------------------------------------------------


class DQNGenerator(GymGenerator):
    """The gym generator stepping a :class:`QNetwork` (epsilon-greedy; greedy as the evaluator)."""

    def build_policy(self, observation_space: gym.Space, action_space: gym.Space,
                     model: ActorCriticConfig | None) -> nn.Module:
        return QNetwork(observation_space, action_space, model)


class DQNTrainer(Trainer):
    """DQN over a ``TransitionBuffer``: its ``train`` pulls the new rollouts' ids and minibatch data
    (instead of consuming whole rollouts), everything else is the base ``Trainer``'s."""

    config: DQNConfig

    def __init__(self, config: DQNConfig, env_id: str, buffer: Any = None, model: ActorCriticConfig | None = None,
                 weights: str = "policy", seed: int = 0) -> None:
        self.env_id, self.model_config = env_id, model
        self.gradient_steps_done = 0
        super().__init__(config, buffer, weights, seed)

    def build_model(self) -> nn.Module:
        return QNetwork(*env_spaces(self.env_id), self.model_config)

    def setup(self) -> None:
        self.target = copy.deepcopy(self.model)
        self.model.epsilon.fill_(self.config.exploration_initial_eps)

    def samples_in(self, batch: ReplaySample) -> int:  # type: ignore[override]  # a replay trainer's batch is a ReplaySample
        return batch.new_samples

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"target": self.target.state_dict(), "gradient_steps_done": self.gradient_steps_done}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        self.target = copy.deepcopy(self.model)
        if "target" in extra:
            self.target.load_state_dict(extra["target"])
        self.gradient_steps_done = int(extra.get("gradient_steps_done", 0))

    def train_step(self, batch: ReplaySample) -> dict[str, float]:  # type: ignore[override]  # a replay trainer's batch is a ReplaySample
        c = self.config
        metrics: dict[str, float] = {"buffer/size": float(batch.size)}
        if batch.transitions is not None:  # before learning_starts: collect only
            metrics.update(dqn_update(self.model, self.target, self.optimizer, batch.transitions, c,
                                      self.gradient_steps_done))
            self.gradient_steps_done += int(metrics["train/gradient_steps"])
        eps = linear_epsilon(self.samples_seen + batch.new_samples, c.total_steps, c.exploration_fraction,
                             c.exploration_initial_eps, c.exploration_final_eps)
        self.model.epsilon.fill_(eps)  # published with the weights that follow this step
        metrics["train/epsilon"] = eps
        return metrics

    @rm.endpoint
    def train(self, batch_size: int, timeout: float = 60.0) -> TrainResult:
        """Wait for ``batch_size`` new rollouts, then ``gradient_steps`` minibatch steps on uniform draws."""
        if self.buffer is None:
            raise RuntimeError("DQNTrainer was built without a buffer; call train_step() directly")
        c = self.config
        res = self.buffer.sample_replay.call_one(batch_size, c.gradient_steps, c.batch_size, c.learning_starts,
                                                 timeout).get()
        if not res.new:
            return TrainResult(self.step, self.version, self.samples_seen)
        out = self.learn(res, max_lag=max(self.version - r.policy_version for r in res.new))
        out.rollout_ids = [r.rollout_id for r in res.new]
        return out
