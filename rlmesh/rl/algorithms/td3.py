"""TD3 (Fujimoto et al., 2018), top to bottom: actor, targets, update.

Twin Delayed DDPG: a deterministic actor ``a = tanh(mu(s))`` trained to maximise ``Q_1(s, mu(s))``, with
the three fixes over DDPG that name it. Everything off-policy it shares with SAC comes from
:mod:`rlmesh.rl.algorithms.sac`: ``[-1, 1]`` actions rescaled to the env's bounds, uniform warm-up
actions until ``learning_starts``, the twin critics (:class:`~rlmesh.rl.algorithms.sac.TwinQ`), the
replay trainer with its exact update-to-data ratio, and the generator. Read in order:

1. **Actor** (:class:`DeterministicActor`): explores with Gaussian noise of std ``exploration_noise``
   added to the action and clipped to ``[-1, 1]``; the std is a buffer, so it travels with the weights.
2. **Targets** (:func:`td3_targets`): *target policy smoothing* (noise of std ``target_policy_noise``,
   clipped to +-``target_noise_clip``, on the target actor's action) and *clipped double Q* (the min
   of the twin target critics): ``y = r + gamma (1 - terminated) min_i Q'_i(s', clip(mu'(s') + eps))``.
3. **Update** (:func:`td3_update`): the critics every gradient step; the actor and all targets (Polyak,
   rate ``tau``) only every ``policy_delay`` steps, *delayed policy updates*, counted across calls.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import torch
from torch import nn

from rlmesh.rl.algorithms.configs.td3 import TD3Config
from rlmesh.rl.algorithms.dqn import soft_update
from rlmesh.rl.algorithms.sac import BoundedActor, OffPolicyGenerator, OffPolicyTrainer, TwinQ, adam, critic_loss, mlp
from rlmesh.rl.replay import Transitions

__all__ = ["DeterministicActor", "TD3Config", "TD3Generator", "TD3Trainer", "smoothed_target_actions",
           "td3_targets", "td3_update"]

# -- 1. actor ----------------------------------------------------------------------------------------------------


class DeterministicActor(BoundedActor):
    """``a = tanh(mu(s))``; exploring: ``clip(a + N(0, exploration_noise^2), -1, 1)``."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes: list[int],
                 exploration_noise: float = 0.1) -> None:
        super().__init__(observation_space, action_space, "TD3")
        self.mu = mlp([self.obs_dim, *hidden_sizes, self.act_dim])
        self.register_buffer("exploration_noise", torch.tensor(float(exploration_noise)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The action in ``[-1, 1]`` at raw observations ``obs`` (with gradients, for the actor loss)."""
        return torch.tanh(self.mu(self.obs_rms.normalize(obs)))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        a = self(obs)
        return (a + torch.randn_like(a) * self.exploration_noise).clamp(-1.0, 1.0)


class TD3Model(nn.Module):
    """Everything TD3 trains and checkpoints: the actor (the only part published), its target, the twin
    critics and their target."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: TD3Config) -> None:
        super().__init__()
        self.actor = DeterministicActor(observation_space, action_space, config.hidden_sizes, config.exploration_noise)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = TwinQ(self.actor.obs_dim, self.actor.act_dim, config.hidden_sizes)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)


# -- 2. targets --------------------------------------------------------------------------------------------------


def smoothed_target_actions(target_actions: torch.Tensor, noise_std: float, noise_clip: float) -> torch.Tensor:
    """Target policy smoothing: ``clip(mu'(s') + clip(N(0, noise_std^2), -noise_clip, noise_clip), -1, 1)``."""
    noise = (torch.randn_like(target_actions) * noise_std).clamp(-noise_clip, noise_clip)
    return (target_actions + noise).clamp(-1.0, 1.0)


@torch.no_grad()
def td3_targets(actor_target: DeterministicActor, critic_target: TwinQ, batch: Transitions, config: TD3Config
                ) -> torch.Tensor:
    """``y = r + gamma (1 - terminated) min_i Q'_i(s', smoothed mu'(s'))`` (truncation keeps the bootstrap)."""
    next_actions = smoothed_target_actions(actor_target(batch.next_obs), config.target_policy_noise,
                                           config.target_noise_clip)
    q1, q2 = critic_target(actor_target.obs_rms.normalize(batch.next_obs), next_actions)
    return batch.rewards + config.gamma * (1.0 - batch.terminated.float()) * torch.min(q1, q2)


# -- 3. update ---------------------------------------------------------------------------------------------------


def td3_update(model: TD3Model, optimizers: dict[str, torch.optim.Optimizer], batch: Transitions, config: TD3Config,
               gradient_steps_done: int = 0) -> dict[str, float]:
    """``len(batch) // batch_size`` critic steps; after every ``policy_delay``-th (counted from
    ``gradient_steps_done``), an actor step on ``-mean Q_1(s, mu(s))`` and the targets' Polyak step."""
    actor, critic = model.actor, model.critic
    model.actor_target.obs_rms.load_state_dict(actor.obs_rms.state_dict())  # one set of statistics
    steps = len(batch) // config.batch_size
    out: dict[str, torch.Tensor] = {}
    for k in range(steps):
        mb = batch[slice(k * config.batch_size, (k + 1) * config.batch_size)]
        obs = actor.obs_rms.normalize(mb.obs)
        targets = td3_targets(model.actor_target, model.critic_target, mb, config)
        q1, q2 = critic(obs, mb.actions)
        loss_q = critic_loss(q1, q2, targets)
        optimizers["critic"].zero_grad(set_to_none=True)
        loss_q.backward()
        optimizers["critic"].step()
        out.update({"losses/critic_loss": loss_q.detach(), "losses/q_mean": q1.detach().mean()})
        if (gradient_steps_done + k + 1) % config.policy_delay == 0:
            critic.requires_grad_(False)  # the actor's loss differentiates through Q_1, not into it
            loss_pi = -critic.q1(torch.cat([obs, actor(mb.obs)], -1)).mean()
            optimizers["actor"].zero_grad(set_to_none=True)
            loss_pi.backward()
            optimizers["actor"].step()
            critic.requires_grad_(True)
            soft_update(model.critic_target, critic, config.tau)
            soft_update(model.actor_target, actor, config.tau)
            out["losses/actor_loss"] = loss_pi.detach()
    metrics = {k: float(v) for k, v in out.items()}
    metrics["train/gradient_steps"] = float(steps)
    return metrics


class TD3Trainer(OffPolicyTrainer):
    """TD3: :class:`TD3Model`, Adam for the actor and the critics, :func:`td3_update`."""

    config: TD3Config

    def build_networks(self, observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
        return TD3Model(observation_space, action_space, self.config)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": adam(self.model.actor.parameters(), self.config.lr),
                "critic": adam(self.model.critic.parameters(), self.config.lr)}

    def update(self, batch: Transitions) -> dict[str, float]:
        return td3_update(self.model, self.opts, batch, self.config, self.gradient_steps_done)


class TD3Generator(OffPolicyGenerator):
    """Steps a :class:`DeterministicActor` (uniform actions until the trainer's ``learning_starts``)."""

    def build_policy(self, observation_space: gym.Space, action_space: gym.Space, model: object) -> nn.Module:
        return DeterministicActor(observation_space, action_space, self.config.hidden_sizes)
