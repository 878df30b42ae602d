"""``AgenticGenerator``: an ``LLMGenerator`` whose work item is a group of multi-turn episodes.

A work item is a list of tasks; each is played ``samples_per_prompt`` times (GRPO's group =
the episodes of one task), every episode on the ``env`` mesh, all of them in flight at once
(:func:`~rlmesh.rl.agentic.episodes.run_episodes`). The trajectories go to the buffer as the
same ``completions`` / ``rewards`` / ``group_size`` record ``LLMGenerator`` sends, so GRPO,
RLOO and DAPO train on them unchanged; only their ``loss_mask`` (observations 0) is new.

Faults: an env proc that dies fails its episodes' pending steps with ``ActorDied``; so does a
step that reaches its replacement (the episode's state died with the old proc). Either way this
call raises ``ActorDied`` and the controller re-issues the work item under the same id.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import rlmesh as rm
from rlmesh.rl.actors.llm_generator import LLMGenerator
from rlmesh.rl.agentic.config import AgenticGeneratorConfig
from rlmesh.rl.agentic.env_actor import EpisodeLost, MeshEnvClient
from rlmesh.rl.agentic.episodes import EpisodeLimits, Trajectory, run_episodes
from rlmesh.rl.backends.base import SamplingParams
from rlmesh.rl.results import EvalResult
from rlmesh.rl.run.schedule import WorkItem

logger = logging.getLogger(__name__)

ARGS_CHARS = 200


class AgenticGenerator(LLMGenerator):
    """Plays episodes on ``env`` (an ``EnvActor`` mesh); no reward actor: the environment scores.

    Args:
        config: sampling and episode limits.
        task: needs ``tokenizer`` (``encode``, ``BOS``/``eos_id``) and ``stop_token_ids``.
        env: the ``EnvActor`` mesh.
    """

    config: AgenticGeneratorConfig

    def __init__(self, config: AgenticGeneratorConfig, task: Any, buffer: Any = None, env: Any = None,
                 backend_kwargs: dict[str, Any] | None = None, weights: str = "policy") -> None:
        super().__init__(config, task, buffer, None, backend_kwargs, weights)
        if env is None:
            raise ValueError("AgenticGenerator needs the env mesh (env=...)")
        self.envs = MeshEnvClient(env)
        self.limits = EpisodeLimits(config.max_turns, config.max_episode_tokens, config.max_new_tokens)

    def _between_turns(self) -> int:
        """The version the next turn generates with; pulls newer weights when partial rollouts are on."""
        if self.config.partial_rollouts and self.version >= 0:
            return self.sync_weights(self.version, timeout=5.0)
        return self.version

    def play(self, episodes: list[tuple[str, Any]], greedy: bool = False) -> list[Trajectory]:
        """Run episodes to their ends on the env mesh (the ``ActorDied`` of a lost episode propagates)."""
        tok = self.task.tokenizer
        params = SamplingParams(temperature=1.0 if greedy else self.config.temperature,
                                top_p=1e-9 if greedy else self.config.top_p,
                                stop_token_ids=tuple(self.task.stop_token_ids))
        t0 = time.perf_counter()
        try:
            trajs = run_episodes(self.backend, self.envs, episodes, tok.encode, self.limits, params,
                                 version=(lambda: self.version) if greedy else self._between_turns,
                                 prompt_prefix=[tok.BOS], decode=tok.decode, max_batch=self.config.max_batch or None)
        except EpisodeLost as exc:  # the env proc was replaced between two steps: the episode is gone
            raise rm.ActorDied(str(exc), mesh=exc.mesh, rank=exc.rank, endpoint="step") from exc
        self.generate_seconds += time.perf_counter() - t0
        self.tokens_generated += sum(t.model_tokens for t in trajs)
        return trajs

    @rm.endpoint
    def generate(self, item: WorkItem, problems: list[Any]) -> dict[str, Any]:
        """Play ``samples_per_prompt`` episodes per problem, submit them as one rollout, record turns."""
        self.sync_weights(item.min_version)
        t0 = time.perf_counter()
        n = self.config.samples_per_prompt
        ids = [f"{item.work_id}/{i * n + k}" for i in range(len(problems)) for k in range(n)]
        trajs = self.play(list(zip(ids, [p for p in problems for _ in range(n)])))
        rewards = [t.reward for t in trajs]
        oldest = min(t.oldest_version for t in trajs)  # the staleness bound holds for every segment
        data = {"completions": [t.completion() for t in trajs], "rewards": rewards, "group_size": n,
                "logprobs_exact": bool(self.backend.logprobs_exact)}
        refused = str(self.buffer.add.call_one(item.work_id, oldest, data, len(trajs)).get())
        if not refused:
            self._record(ids, trajs, time.perf_counter() - t0)
        tokens = sum(t.model_tokens for t in trajs)
        return {"rollout_id": item.work_id, "policy_version": self.version, "accepted": not refused,
                "reason": refused, "samples": len(trajs), "tokens": tokens, "mean_reward": sum(rewards) / len(rewards),
                "gen_tokens_per_s": self.tokens_generated / max(self.generate_seconds, 1e-9),
                "turns": sum(len(t.turns) for t in trajs)}

    def _record(self, ids: list[str], trajs: list[Trajectory], took: float) -> None:  # type: ignore[override]  # its own record of episodes; LLMGenerator's callers never reach it
        env = getattr(self.task, "name", type(self.task).__name__)
        rm.telemetry.record_batch("rollouts", {
            "rollout_id": ids, "policy_version": [t.oldest_version for t in trajs], "reward": [t.reward for t in trajs],
            "length": [len(t.token_ids) for t in trajs], "env": [env] * len(ids),
            "duration_s": [took / len(ids)] * len(ids), "samples": [1] * len(ids)})
        record_turns(ids, trajs)

    @rm.endpoint
    def evaluate(self, problems: list[Any], min_version: int = 0, env_steps: int | None = None) -> EvalResult:
        """Greedy episodes on held-out ``problems``; an ``evals`` row with ``metric='mean_reward'``."""
        def measure() -> tuple[str, float, int]:
            trajs = self.play([(f"eval-v{self.version}/{k}", p) for k, p in enumerate(problems)], greedy=True)
            return "mean_reward", sum(t.reward for t in trajs) / len(trajs), len(problems)

        return self.evaluation(min_version, env_steps, measure)


def record_turns(ids: list[str], trajs: list[Trajectory]) -> None:
    """One ``turns`` row per model turn of each trajectory."""
    cols: dict[str, list[Any]] = {k: [] for k in ("rollout_id", "turn", "tool", "args", "tool_latency_s",
                                                  "env_latency_s", "tokens_out", "tokens_in", "reward", "error",
                                                  "policy_version", "ended")}
    for rid, t in zip(ids, trajs):
        for turn in t.turns:
            last = turn.index == len(t.turns) - 1
            for k, v in (("rollout_id", rid), ("turn", turn.index), ("tool", turn.tool),
                         ("args", None if turn.args is None else turn.args[:ARGS_CHARS]),
                         ("tool_latency_s", turn.tool_latency_s), ("env_latency_s", turn.env_latency_s),
                         ("tokens_out", turn.tokens_out), ("tokens_in", turn.tokens_in), ("reward", turn.reward),
                         ("error", turn.error), ("policy_version", turn.policy_version),
                         ("ended", str(t.end) if last else None)):
                cols[k].append(v)
    if cols["rollout_id"]:
        rm.telemetry.record_batch("turns", cols)
