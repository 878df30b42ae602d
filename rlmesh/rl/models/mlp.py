"""MLP actor-critic built from gymnasium spaces: Categorical for ``Discrete``, diagonal
Gaussian for ``Box`` actions.

The same module runs in a ``GymGenerator`` (``act`` under ``torch.no_grad``, shipping
its ``state_dict`` through ``rm.weights``) and in a ``PPOTrainer`` (``evaluate``). The
distribution maths is written out by hand rather than through ``torch.distributions``:
for batch-of-8 CPU rollouts the distribution objects' construction and argument
validation cost more than the network itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlmesh.rl.models.normalize import RunningMeanStd

try:  # gymnasium is a core dependency, but keep the import error readable.
    from gymnasium import spaces
except ImportError as exc:  # pragma: no cover
    raise ImportError("rlmesh.rl.models.mlp needs gymnasium: pip install 'gymnasium>=1.0'") from exc


@dataclass
class ActorCriticConfig:
    """Shape of the actor-critic network."""

    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers, the same for actor and critic (separate trunks)."""
    activation: str = "tanh"
    """``tanh`` (the robust default for PPO on control tasks) or ``relu``."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (``Box`` actions only)."""

    def __post_init__(self) -> None:
        if not self.hidden_sizes or any(h <= 0 for h in self.hidden_sizes):
            raise ValueError(f"ActorCriticConfig.hidden_sizes must be positive widths, got {self.hidden_sizes}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"ActorCriticConfig.activation={self.activation!r} is not one of {sorted(_ACTIVATIONS)}"
            )


_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _mlp(sizes: list[int], activation: type[nn.Module], out_gain: float) -> nn.Sequential:
    """Orthogonal init (gain sqrt 2 hidden, ``out_gain`` last), zero biases."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over a flat observation.

    The actor's last layer starts near zero (gain 0.01) so the initial policy is close to
    uniform (or to the initial Gaussian), which is what keeps early PPO updates stable.
    """

    def __init__(
        self, observation_space: spaces.Space, action_space: spaces.Space, config: ActorCriticConfig | None = None
    ) -> None:
        super().__init__()
        config = config or ActorCriticConfig()
        if not isinstance(observation_space, spaces.Box):
            raise TypeError(
                f"ActorCritic needs a Box observation space, got {observation_space}; "
                "flatten it first (gymnasium.wrappers.FlattenObservation)"
            )
        obs_dim = int(np.prod(observation_space.shape))
        act = _ACTIVATIONS[config.activation]
        hidden = list(config.hidden_sizes)
        self.discrete = isinstance(action_space, spaces.Discrete)
        if self.discrete:
            out_dim = int(action_space.n)  # type: ignore[attr-defined]  # a Discrete space
        elif isinstance(action_space, spaces.Box):
            out_dim = int(np.prod(action_space.shape))
            self.log_std = nn.Parameter(torch.full((out_dim,), float(config.init_log_std)))
            self.action_low = np.asarray(action_space.low, dtype=np.float32)
            self.action_high = np.asarray(action_space.high, dtype=np.float32)
            self.register_buffer("squash", torch.tensor(False))
            """Squash actions into the bounds with tanh instead of clipping them (:meth:`env_actions`);
            a buffer, so a generator's policy squashes exactly when the trainer's weights say so."""
            self.sde_log_std = nn.Parameter(torch.zeros(hidden[-1], out_dim))
            """gSDE's log std of the exploration matrix's entries (unused, and untouched by the optimiser,
            until :meth:`enable_sde`); always present so every policy of a run has the same state_dict."""
            self.register_buffer("use_sde", torch.tensor(False))
            self.register_buffer("sde_sample_freq", torch.tensor(-1))
            """gSDE's settings, buffers so they travel with the weights to generators (see :meth:`enable_sde`)."""
            self._sde_noise: torch.Tensor | None = None  # per-env exploration matrices [N, H, A]; not in the state_dict
            self._sde_steps = 0
        else:
            raise TypeError(f"ActorCritic supports Discrete and Box action spaces, got {action_space}")
        self.action_shape = () if self.discrete else tuple(action_space.shape)  # type: ignore[arg-type]  # a Box space has a shape
        self.actor = _mlp([obs_dim, *hidden, out_dim], act, out_gain=0.01)
        self._actor_trunk = tuple(self.actor)[:-1]  # the layers up to the last hidden one (gSDE's features)
        self.critic = _mlp([obs_dim, *hidden, 1], act, out_gain=1.0)
        self.obs_rms = RunningMeanStd(tuple(observation_space.shape))
        """Observation statistics (off until the trainer's first ``update``); every method below
        takes *raw* observations and normalises them here, so rollouts store raw observations."""
        self.return_rms = RunningMeanStd(())
        """Discounted-return statistics that scale rewards (trainer side only; checkpointed with the model)."""
        self.register_buffer("reward_gamma", torch.tensor(0.0))
        """The discount of the running return whose spread scales rewards; set by a trainer that scales
        them and carried to generators by the weights, so they track that return across rollouts (0: off)."""

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any, **kwargs: Any) -> None:
        # Flags added after the first release: a checkpoint written before them loads with their defaults.
        for name in ("reward_gamma", "squash", "use_sde", "sde_sample_freq"):
            if name in self._buffers and prefix + name not in state_dict:
                state_dict[prefix + name] = self._buffers[name].clone()
        if "sde_log_std" in self._parameters and prefix + "sde_log_std" not in state_dict:
            state_dict[prefix + "sde_log_std"] = self.sde_log_std.detach().clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def enable_squash(self) -> None:
        """Squash Gaussian actions into the action bounds by tanh from now on (the trainer calls it once).

        The policy stays a Gaussian over the pre-squash value ``u`` (what rollouts store and log-probs
        are of); the env gets ``low + (tanh(u) + 1) / 2 * (high - low)``. The tanh Jacobian depends on
        ``u`` alone, so it cancels in PPO's ratio ``pi_new(u) / pi_old(u)`` and in the policy gradient:
        the update needs no change. The entropy bonus stays the Gaussian's (the squashed one has no
        closed form). Needs finite bounds; raises ``ValueError`` otherwise.
        """
        if self.discrete:
            raise ValueError("tanh squashing is for Box (continuous) actions; this policy is Categorical")
        if not (np.isfinite(self.action_low).all() and np.isfinite(self.action_high).all()):
            raise ValueError(f"tanh squashing needs finite action bounds, got low={self.action_low} "
                             f"high={self.action_high}")
        self.squash.fill_(True)

    def enable_sde(self, sample_freq: int = -1, log_std_init: float = 0.0) -> None:
        """Explore by gSDE (Raffin et al., 2021) from now on (the trainer calls it once).

        The Gaussian's std becomes state-dependent, ``sqrt(features(s)^2 @ exp(sde_log_std)^2)`` with
        ``features`` the actor's last hidden layer (detached), and a sample is ``mean + features(s) @ W``
        with ``W ~ N(0, exp(sde_log_std)^2)`` held for ``sample_freq`` env steps (-1: a rollout), so
        exploration is smooth in time instead of independent at every step. Log-probs and entropy are
        the per-state Gaussian's, so PPO's update needs no change."""
        if self.discrete:
            raise ValueError("gSDE is for Box (continuous) actions; this policy is Categorical")
        self.use_sde.fill_(True)
        self.sde_sample_freq.fill_(int(sample_freq))
        with torch.no_grad():
            self.sde_log_std.fill_(float(log_std_init))

    def reset_noise(self, num_envs: int) -> None:
        """gSDE: draw new exploration matrices, one per env (a collector calls it at each rollout's start)."""
        if not self.discrete and bool(self.use_sde):
            sigma = self.sde_log_std.detach().exp()
            self._sde_noise = sigma * torch.randn(num_envs, *sigma.shape)
            self._sde_steps = 0

    def _features_head(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's last hidden layer and its output (mean or logits), at raw observations."""
        features = self.obs_rms.normalize(obs)
        for layer in self._actor_trunk:  # not self.actor[:-1]: slicing builds a new Sequential on every call
            features = layer(features)
        return features, self.actor[-1](features)

    def _sde_std(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(features.detach().pow(2) @ self.sde_log_std.exp().pow(2) + 1e-6)

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """What the env is stepped with for a batch of sampled (or greedy) ``actions``: discrete ones as
        they are; Gaussian ones squashed into the bounds by tanh (after :meth:`enable_squash`) or clipped."""
        a = actions.detach().numpy()
        if self.discrete:
            return a
        if bool(self.squash):
            return self.action_low + 0.5 * (np.tanh(a) + 1.0) * (self.action_high - self.action_low)
        return np.clip(a, self.action_low, self.action_high)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s), shape [B]."""
        return self.critic(self.obs_rms.normalize(obs)).squeeze(-1)

    def _log_prob_entropy(
        self, head: torch.Tensor, actions: torch.Tensor, features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            log_probs = torch.log_softmax(head, dim=-1)
            logp = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            return logp, entropy
        if features is not None and bool(self.use_sde):
            log_std = self._sde_std(features).log()
        else:
            log_std = self.log_std.expand_as(head)
        z = (actions - head) * torch.exp(-log_std)
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)
        return logp, entropy

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (or take the mode of) the policy: ``(actions, log_probs, values)``.

        Continuous actions are returned unclipped and unsquashed (their log-prob is of the sampled
        value); :meth:`env_actions` turns them into what the env is stepped with.
        """
        features, head = self._features_head(obs)
        if self.discrete:
            if greedy:
                actions = head.argmax(-1)
            else:
                actions = torch.multinomial(torch.softmax(head, -1), 1).squeeze(-1)
        elif greedy:
            actions = head
        elif bool(self.use_sde):
            freq = int(self.sde_sample_freq)
            if self._sde_noise is None or self._sde_noise.shape[0] != obs.shape[0] or \
                    (freq > 0 and self._sde_steps % freq == 0):
                self.reset_noise(obs.shape[0])
            self._sde_steps += 1
            assert self._sde_noise is not None
            actions = head + torch.bmm(features.unsqueeze(1), self._sde_noise).squeeze(1)
        else:
            actions = head + torch.randn_like(head) * self.log_std.exp()
        logp, _ = self._log_prob_entropy(head, actions, features)
        return actions, logp, self.value(obs)

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_probs, entropy, values)`` of given actions, with gradients (for the trainer)."""
        features, head = self._features_head(obs)
        logp, entropy = self._log_prob_entropy(head, actions, features)
        return logp, entropy, self.value(obs)
