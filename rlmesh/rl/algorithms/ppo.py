"""PPO (Schulman et al., 2017), top to bottom: advantages, loss, update.

Read in order, this file is the whole algorithm on a batch of rollouts:

1. **Reward scaling** (:func:`scale_rewards`, optional): rewards divided by the running std of
   the discounted return, as SB3's ``VecNormalize`` does; observation normalisation lives in the
   policy itself (:class:`~rlmesh.rl.models.normalize.RunningMeanStd`, updated by
   :func:`update_normalizers` after each step), so its statistics travel with the weights.
2. **Advantages** (:func:`compute_gae`): GAE(gamma, lambda) with the truncation bootstrap.
3. **Loss** (:func:`ppo_loss`): the clipped surrogate, the value regression, the entropy bonus.
4. **Update** (:func:`ppo_update`): ``update_epochs`` passes of shuffled minibatches, gradient
   clipping, optional early stop on approx-KL.

Everything is tensors in, tensors out (unit-tested without processes). The actor that runs it
distributed is :class:`PPOTrainer` (section 5, hooks ``compute_advantages`` / ``compute_loss``); the
single-process reference loop is
:func:`rlmesh.rl.ppo_core.train_ppo`; A2C (:mod:`rlmesh.rl.algorithms.a2c`) is this update with
one epoch, one minibatch and no ratio.

GAE: why the explicit ``next_values`` and the split between ``terminated`` and ``dones``:
an episode that *terminates* (the pole fell) has no future, so its bootstrap is 0; an
episode that is *truncated* (time limit) does have one, and we must bootstrap from the
value of its real final observation, not from the reset observation that follows it.
Passing ``next_values[t] = V(s_{t+1})`` where ``s_{t+1}`` is the true next state makes
both cases exact, and works for either gymnasium autoreset mode:

- ``NEXT_STEP`` (gymnasium's default): the observation returned on the done step *is*
  the final one, so ``next_values = cat(values[1:], last_value)`` with no extra forward
  pass; the following "reset step" transition is junk and must be masked by the caller.
- ``SAME_STEP``: ``next_values`` at done steps comes from ``info["final_obs"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
import secrets
import time
from typing import Any

import numpy as np
import torch

import rlmesh as rm
from rlmesh.rl.actors.gym_generator import env_spaces, record_rollout
from rlmesh.rl.actors.trainer import Trainer
from rlmesh.rl.config import ConfigError, GymGeneratorConfig, PPOConfig
from rlmesh.rl.losses.output import LossOutput
from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig
from rlmesh.rl.results import TrainResult
from rlmesh.rl.rollout import Rollout, RolloutCollector, concat_rollouts

# -- 1. reward scaling and observation statistics ----------------------------------------------------------------


def discounted_returns(rewards: torch.Tensor, dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t-1}``, reset after each episode end, over ``[T, N]``.

    This is the running return whose spread SB3's ``VecNormalize`` divides rewards by. Computed here
    it starts from 0 at the rollout's first step, which underestimates the first ``1 / (1 - gamma)``
    steps of each rollout: badly so for short rollouts (A2C's 5 steps see at most 5 rewards of a
    return whose horizon is 100). Generators therefore carry it across rollouts and ship it
    (``Rollout.discounted_returns``) once the policy's ``reward_gamma`` is set; this is the fallback.
    """
    out = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0]):
        running = rewards[t] + gamma * running
        out[t] = running
        running = running * (1.0 - dones[t])
    return out


def scale_rewards(policy: ActorCritic, rollout: Rollout, gamma: float) -> torch.Tensor:
    """Update the return statistics with this batch, then return ``clip(r / std(G))`` ([T, N])."""
    keep = rollout.valid
    carried = rollout.discounted_returns
    policy.return_rms.update((discounted_returns(rollout.rewards, rollout.dones, gamma) if carried is None
                              else carried)[keep])
    return policy.return_rms.scale(rollout.rewards)


def update_normalizers(policy: ActorCritic, rollout: Rollout) -> None:
    """Merge the batch's raw observations into the policy's statistics.

    Called *after* the update: the batch was collected, and its log-probs computed, with the
    statistics the trainer held before it, so the first minibatch sees a ratio of exactly 1.
    The next published weights carry the new statistics to generators and the evaluator.
    """
    policy.obs_rms.update(rollout.obs[rollout.valid])


# -- 2. advantages ---------------------------------------------------------------------------------------------


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(advantages, returns)``, both shaped like ``rewards`` ([T, N] or [T]).

    Args:
        rewards: r_t for each step.
        values: V(s_t), the critic's estimate at each step's observation.
        next_values: V(s_{t+1}) for the true next state of each step (see module doc).
        terminated: 1 where s_{t+1} is terminal (no bootstrap).
        dones: 1 where the episode ended at step t for any reason (terminated or
            truncated); the advantage recursion is cut there.
        gamma: discount factor.
        gae_lambda: GAE lambda; 1 gives Monte-Carlo-with-bootstrap, 0 gives TD(0).

    ``returns = advantages + values`` is the regression target for the critic
    (TD(lambda) returns).
    """
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape == dones.shape):
        raise ValueError(
            "compute_gae: rewards, values, next_values, terminated and dones must share a shape, got "
            f"{[tuple(t.shape) for t in (rewards, values, next_values, terminated, dones)]}"
        )
    not_terminal = 1.0 - terminated.to(values.dtype)
    not_done = 1.0 - dones.to(values.dtype)
    deltas = rewards + gamma * next_values * not_terminal - values
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * gae_lambda * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


def rollout_advantages(rollout: Rollout, gamma: float, gae_lambda: float,
                       rewards: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over a :class:`Rollout` (``rewards`` replaces its rewards, e.g. scaled ones);
    ``next_values`` are the next step's values (NEXT_STEP autoreset)."""
    next_values = torch.cat([rollout.values[1:], rollout.last_value.unsqueeze(0)])
    return compute_gae(rollout.rewards if rewards is None else rewards, rollout.values, next_values,
                       rollout.terminated, rollout.dones, gamma, gae_lambda)


# -- 3. loss ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PPOLossOutput(LossOutput):
    """The loss of an actor-critic minibatch and its parts (all 0-d tensors): PPO's, and A2C's
    (whose ``approx_kl`` and ``clip_fraction`` are 0: it has no old policy to compare with)."""

    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


def ppo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip_coef: float = 0.2,
    value_clip_coef: float | None = None,
    value_coef: float = 0.5,
    entropy_coef: float = 0.0,
    normalize_advantages: bool = True,
) -> PPOLossOutput:
    """Clipped PPO loss over a flat minibatch (every argument shaped [B]).

    Args:
        new_logprobs / old_logprobs: log pi(a|s) under the current and the behaviour policy.
        advantages: A(s, a), e.g. from :func:`compute_gae`.
        new_values / old_values: the critic now and at collection time.
        returns: the critic's regression target.
        entropy: per-sample policy entropy (its mean is the bonus).
        clip_coef: epsilon of the ratio clip, ``[1 - eps, 1 + eps]``.
        value_clip_coef: if set, clip the value change to +-this around ``old_values``
            and take the pessimistic (max) of clipped and unclipped squared errors;
            ``None`` uses the plain squared error (often better, see Andrychowicz et al. 2021).
        value_coef, entropy_coef: weights in ``policy_loss + c_v * value_loss - c_e * entropy``.
        normalize_advantages: standardise advantages within the minibatch.

    The value loss is ``0.5 * mean((V - R)^2)`` so its gradient is ``mean(V - R)``.
    """
    if normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    surrogate = advantages * ratio
    surrogate_clipped = advantages * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    policy_loss = -torch.min(surrogate, surrogate_clipped).mean()

    if value_clip_coef is None:
        value_loss = 0.5 * (new_values - returns).pow(2).mean()
    else:
        clipped = old_values + (new_values - old_values).clamp(-value_clip_coef, value_clip_coef)
        value_loss = 0.5 * torch.max((new_values - returns).pow(2), (clipped - returns).pow(2)).mean()

    entropy_mean = entropy.mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return PPOLossOutput(loss, policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction)


# -- 4. update -------------------------------------------------------------------------------------------------


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
    """One PPO train step on a rollout: (scaled rewards), advantages, then ``update_epochs`` of minibatches,
    then (``normalize_obs``) the observation statistics.

    Returns the last minibatch's ``losses/*`` metrics plus ``losses/explained_variance``
    and ``train/minibatch_updates``. ``clip_coef`` overrides ``config.clip_coef`` (for annealing).
    ``advantages_fn(rollout) -> (advantages, returns)`` (``[T, N]`` each) and ``loss_fn`` (same
    arguments and result as :func:`ppo_loss`) replace the defaults: they are
    ``PPOTrainer``'s ``compute_advantages`` / ``compute_loss`` hooks.
    """
    clip = config.clip_coef if clip_coef is None else clip_coef
    loss_fn = loss_fn or ppo_loss
    with torch.no_grad():
        if config.normalize_reward:
            rollout = replace(rollout, rewards=scale_rewards(policy, rollout, config.gamma))
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
    if config.normalize_obs:
        update_normalizers(policy, rollout)
    metrics = out.metrics() if out is not None else {}
    var = returns.var()
    metrics["losses/explained_variance"] = float(1 - (returns - old_values).var() / var) if var > 0 else float("nan")
    metrics["train/minibatch_updates"] = float(updates)
    return metrics


def build_policy(obs_space: Any, act_space: Any, model: ActorCriticConfig | None, config: PPOConfig) -> ActorCritic:
    """The actor-critic for these spaces, with the settings of ``config`` that travel in its weights:
    ``reward_gamma`` (``normalize_reward``), tanh squashing (``squash_actions``) and gSDE (``use_sde``)."""
    policy = ActorCritic(obs_space, act_space, model)
    if config.normalize_reward:  # generators track the running return with the trainer's discount
        policy.reward_gamma.fill_(config.gamma)
    if config.squash_actions:
        try:
            policy.enable_squash()
        except ValueError as exc:
            raise ConfigError(f"trainer.squash_actions=True is invalid: {exc}; use trainer.squash_actions=false "
                              "(actions are then clipped to the bounds)") from exc
    if config.use_sde:
        try:
            policy.enable_sde(config.sde_sample_freq, config.sde_log_std_init)
        except ValueError as exc:
            raise ConfigError(f"trainer.use_sde=True is invalid: {exc}; use trainer.use_sde=false") from exc
    return policy


def make_optimizer(policy: torch.nn.Module, config: PPOConfig) -> torch.optim.Optimizer:
    """Adam, fused where the build supports it: on CPU that is ~20% off a small-MLP update."""
    try:
        return torch.optim.Adam(policy.parameters(), lr=config.lr, eps=config.adam_eps, fused=True)
    except (RuntimeError, TypeError):  # older builds or devices without a fused kernel
        return torch.optim.Adam(policy.parameters(), lr=config.lr, eps=config.adam_eps)


# -- 5. the trainer actor ---------------------------------------------------------------------------------------


class PPOTrainer(Trainer):
    """PPO on batches of :class:`~rlmesh.rl.rollout.Rollout` (one per generator work item).

    Learning rate and clip decay linearly over ``config.total_steps`` *trained* env steps
    when ``anneal_lr`` / ``anneal_clip`` are set.

    It can also step a generator config's envs itself with the module it trains
    (:meth:`collect_and_train`, ``generator.in_trainer``): the loop of one process, with the evaluator,
    telemetry, checkpoints and recovery of a run around it. Subclasses inherit it as they are.
    """

    config: PPOConfig

    def __init__(self, config: PPOConfig, env_id: str, buffer: Any = None, model: ActorCriticConfig | None = None,
                 weights: str = "policy", seed: int = 0) -> None:
        self.env_id, self.model_config = env_id, model
        self._shuffle = torch.Generator().manual_seed(seed)
        self.collector: RolloutCollector | None = None
        """Built by the first :meth:`collect_and_train` call (again in a restarted proc)."""
        self._collect_tag = secrets.token_hex(3)
        """In this trainer's rollout ids: a restarted or resumed trainer that redoes a step never reuses one."""
        super().__init__(config, buffer, weights, seed)

    def build_model(self) -> torch.nn.Module:
        obs_space, act_space = env_spaces(self.env_id)
        return build_policy(obs_space, act_space, self.model_config, self.config)

    @rm.endpoint
    def collect_and_train(self, collect: GymGeneratorConfig, until_samples: int) -> TrainResult:
        """Collect one rollout with the module being trained, train one step on it, and again, until
        ``samples_seen`` reaches ``until_samples``; then publish the weights (the evaluator's) and
        checkpoint (``trainer.checkpoint_every`` > 0) once, for the whole call.

        Why: a strictly on-policy update on a small rollout (A2C: 40 transitions) costs less than a
        round trip through generator, buffer and trainer procs plus a weight version per update; here
        each step is the single-process loop's (the same draws, the same weights, bit for bit). Each
        rollout still lands in the ``rollouts`` table, tagged with the step whose weights collected it;
        a ``train_steps`` row carries the version its weights are published under when they are (the
        step's number, as :meth:`publish` numbers it; the call's last step's is published). A trainer
        killed mid-call restarts from the previous call's checkpoint and redoes that call's steps."""
        if self.collector is None:
            # seeded as generator replica 0 seeds its proc (GymGenerator): the same run draws the same actions
            torch.manual_seed(collect.seed)
            np.random.seed(collect.seed % 2**32)
            self.collector = RolloutCollector(collect, self.model, seed=collect.seed)
        out = TrainResult(self.step, self.version, self.samples_seen)
        while self.samples_seen < until_samples:
            self.clock.reset()
            t0 = time.perf_counter()
            with self.clock.section("sample_s"):  # the wait for data, as sampling the buffer would be
                rollout = self.collector.collect(policy_version=self.step)
            record_rollout(f"{self.weights}-{self._collect_tag}-{self.step + 1}", rollout, self.step, collect.env_id,
                           time.perf_counter() - t0)
            out = self.learn([rollout], deferred=True)
        if out.trained:
            self.publish()
            out.policy_version = self.version
            if self.config.checkpoint_dir and self.config.checkpoint_every:
                self.save_checkpoint()
        return out

    def on_stop(self) -> None:
        if self.collector is not None:
            self.collector.close()
        super().on_stop()

    def build_optimizer(self) -> torch.optim.Optimizer:
        return make_optimizer(self.model, self.config)

    def samples_in(self, batch: list[Rollout]) -> int:
        return sum(r.num_steps for r in batch)

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"shuffle_rng": self._shuffle.get_state()}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        if "shuffle_rng" in extra:
            self._shuffle.set_state(extra["shuffle_rng"])

    def progress_left(self) -> float:
        """Fraction of the env-step budget not yet trained on (1 -> 0): the annealing factor."""
        return max(0.0, 1.0 - self.samples_seen / self.config.total_steps)

    # -- hooks -------------------------------------------------------------------------------------------------

    def compute_advantages(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook: ``(advantages, returns)``, each ``[T, N]``, for one concatenated batch.

        Runs once per train step under ``torch.no_grad()``, before any minibatch; may
        assume ``rollout.values`` / ``last_value`` came from the behaviour policy.
        Default: GAE(gamma, lambda) with the truncation bootstrap.
        """
        return rollout_advantages(rollout, self.config.gamma, self.config.gae_lambda)

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        """Hook: the minibatch loss, called once per minibatch with the arguments of
        :func:`rlmesh.rl.algorithms.ppo.ppo_loss` (new log-probs, old log-probs, advantages, values,
        old values, returns, entropy, then the coefficients as keywords); must return an
        object with ``.loss`` (to backpropagate), ``.approx_kl`` and ``.metrics()``."""
        return ppo_loss(*args, **kwargs)

    # -- the step ----------------------------------------------------------------------------------------------

    def train_step(self, batch: list[Rollout]) -> dict[str, float]:
        rollout = concat_rollouts(batch) if len(batch) > 1 else batch[0]
        frac = self.progress_left()
        if self.config.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = self.config.lr * frac
        clip = self.config.clip_coef * frac if self.config.anneal_clip else None
        metrics = ppo_update(self.model, self.optimizer, rollout, self.config, clip, self._shuffle,
                             advantages_fn=self.compute_advantages, loss_fn=self.compute_loss)
        if rollout.episode_returns:
            metrics["charts/episodic_return"] = sum(rollout.episode_returns) / len(rollout.episode_returns)
        return metrics
