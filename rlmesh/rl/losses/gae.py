"""Generalised Advantage Estimation (Schulman et al., 2016) over a [T, N] rollout.

Why the explicit ``next_values`` and the split between ``terminated`` and ``dones``:
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

import torch


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
