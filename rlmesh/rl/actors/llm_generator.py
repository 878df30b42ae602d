"""``LLMGenerator``: N completions per prompt through a generation backend, scored by reward actors.

Backend-agnostic by construction: it speaks only the contract of
:mod:`rlmesh.rl.backends.base` (``generate`` / ``weight_target`` / ``load_weights``), so
``generator.backend=torch`` (the small KV-cache transformer, CPU) and ``vllm`` run the same
code. A work item is a list of prompts; the generator samples ``samples_per_prompt``
completions each, asks a ``RewardActor`` (peer to peer, the least busy one) to score
them, and hands the scored groups to the buffer as one rollout whose id is the work id.
Each completion gets its own ``rollouts`` row, id ``<work_id>/<k>``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import rlmesh as rm
from rlmesh.rl.actors.generator import Generator
from rlmesh.rl.backends.base import Completion, SamplingParams, make_backend
from rlmesh.rl.backends.decode import finish_completions
from rlmesh.rl.config import LLMGeneratorConfig
from rlmesh.rl.results import EvalResult
from rlmesh.rl.run.schedule import WorkItem
from rlmesh.rl.run.warmup import WarmupPhase

logger = logging.getLogger(__name__)


class LLMGenerator(Generator):
    """Samples completions for prompts; ``reward`` is the ``RewardActor`` mesh that scores them.

    Args:
        config: sampling settings (backend, N, max tokens, temperature, top-p).
        task: the task object (``encode_prompt``, ``tokenizer``, ``name``); it travels by value. Its
            tokenizer (the model's, for a model folder) renders prompts and decodes completions.
        backend_kwargs: passed to the backend's constructor (the torch backend takes
            ``model_config`` or ``model_path``; see :func:`backend_kwargs_for`).
    """

    def __init__(self, config: LLMGeneratorConfig, task: Any, buffer: Any = None, reward: Any = None,
                 backend_kwargs: dict[str, Any] | None = None, weights: str = "policy") -> None:
        super().__init__(buffer, weights)
        self.config, self.task, self.reward = config, task, reward
        self.score_retry_s = 120.0
        """How long scoring retries on other reward replicas while reward procs are being replaced."""
        with WarmupPhase("engine start", unit="engines"):  # vLLM's start takes minutes: shown while spawn waits
            self.backend = make_backend(config.backend, **(backend_kwargs or {}))
        self.tokens_generated = 0
        self.generate_seconds = 0.0
        self.prompt_truncated: list[bool] = []
        """Per problem of the last :meth:`_sample`: its prompt was cut to ``max_prompt_tokens``."""

    def weight_target(self) -> Any:
        return self.backend.weight_target()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.backend.load_weights(state_dict)

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        """Hook: how to sample. ``greedy`` (evaluation) keeps only the argmax token."""
        stop = tuple(self.config.stop)
        if greedy:
            return SamplingParams(n=1, max_tokens=self.config.max_new_tokens, temperature=1.0, top_p=1e-9, stop=stop)
        return SamplingParams(n=self.config.samples_per_prompt, max_tokens=self.config.max_new_tokens,
                              temperature=self.config.temperature, top_p=self.config.top_p, stop=stop)

    def _sample(self, problems: list[Any], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions per problem, decoded by the task's tokenizer (the model's) and cut
        at ``generator.stop`` the same way whatever the backend (:mod:`rlmesh.rl.backends.decode`)."""
        t0 = time.perf_counter()
        cap = self.config.max_prompt_tokens
        prompts = [self.task.encode_prompt(p) for p in problems]
        self.prompt_truncated = [cap is not None and len(ids) > cap for ids in prompts]
        if cap is not None:
            prompts = [ids[-cap:] for ids in prompts]
        groups = self.backend.generate(prompts, params)
        flat = [c for g in groups for c in g]
        finish_completions(flat, self.task.tokenizer, self.config.stop)
        self.generate_seconds += time.perf_counter() - t0
        self.tokens_generated += sum(len(c.token_ids) for c in flat)
        return flat

    def _score(self, ids: list[str], flat: list[Completion], problems: list[Any], n: int) -> list[float]:
        items = [{"rollout_id": ids[i], "text": c.text, "answer": problems[i // n].answer} for i, c in enumerate(flat)]
        if self.reward is None:
            raise RuntimeError("LLMGenerator needs a reward actor mesh to score completions (reward=...)")
        deadline = time.monotonic() + self.score_retry_s
        while True:
            try:
                return list(self.reward.score.choose(items).get())
            except rm.ActorDied as exc:  # a reward proc died mid-call: score on a live replica (or its replacement)
                if time.monotonic() > deadline:
                    raise
                work_id = ids[0].split("/")[0]
                logger.warning("scoring %s on %s failed (%s); retrying on a live reward replica", work_id, exc.mesh,
                               exc)
                rm.telemetry.record("work_items", work_id=work_id, event="rescored",
                                    reason=f"reward proc died: {str(exc).splitlines()[0][:200]}", attempt=0,
                                    generation=None)
                time.sleep(0.05)

    @rm.endpoint
    def generate(self, item: WorkItem, problems: list[Any]) -> dict[str, Any]:
        """Sample, score and submit one work item; returns counts for the progress bar."""
        self.sync_weights(item.min_version)
        t0 = time.perf_counter()
        params = self.sampling_params()
        flat = self._sample(problems, params)
        ids = [f"{item.work_id}/{k}" for k in range(len(flat))]
        rewards = self._score(ids, flat, problems, params.n)
        data = {"completions": flat, "rewards": rewards, "group_size": params.n,
                "logprobs_exact": bool(self.backend.logprobs_exact)}
        refused = self.submit(item.work_id, data, len(flat))
        accepted = not refused
        if accepted:
            self._record(ids, flat, rewards, problems, params.n, time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for c in flat)
        return {"rollout_id": item.work_id, "policy_version": self.version, "accepted": accepted, "reason": refused,
                "samples": len(flat), "tokens": tokens, "mean_reward": sum(rewards) / len(rewards),
                "gen_tokens_per_s": self.tokens_generated / max(self.generate_seconds, 1e-9)}

    def _record(self, ids: list[str], flat: list[Completion], rewards: list[float], problems: list[Any], n: int,
                took: float) -> None:
        """One ``rollouts`` row per completion, and the first ``samples_per_item`` to ``samples``."""
        rows = range(len(ids))
        rm.telemetry.record_batch("rollouts", {
            "rollout_id": ids, "policy_version": [self.version] * len(ids), "reward": rewards,
            "length": [len(c.token_ids) for c in flat], "env": [getattr(self.task, "name", type(self.task).__name__)] * len(ids),
            "duration_s": [took / len(ids)] * len(ids), "samples": [1] * len(ids),
            "source": [getattr(problems[i // n], "source", "") or None for i in rows],
            "finish_reason": [c.finish_reason for c in flat],
            "prompt_tokens": [len(c.prompt_ids) for c in flat],
            "prompt_truncated": [self.prompt_truncated[i // n] for i in rows]})
        keep = min(self.config.samples_per_item, len(ids))
        if keep:
            cut = self.config.sample_chars
            rm.telemetry.record_batch("samples", {
                "rollout_id": ids[:keep], "policy_version": [self.version] * keep,
                "prompt": [problems[i // n].prompt[:cut] for i in range(keep)],
                "completion": [flat[i].text[:cut] for i in range(keep)],
                "answer": [str(problems[i // n].answer)[:cut] for i in range(keep)],
                "reward": rewards[:keep],
                "source": [getattr(problems[i // n], "source", "") or None for i in range(keep)]})

    @rm.endpoint
    def evaluate(self, problems: list[Any], min_version: int = 0, env_steps: int | None = None) -> EvalResult:
        """Greedy completions of held-out ``problems``, scored by the reward actor; writes an
        ``evals`` row with ``metric='mean_reward'``, once per version."""
        def measure() -> tuple[str, float, int]:
            flat = self._sample(problems, self.sampling_params(greedy=True))
            rewards = self._score([f"eval-v{self.version}/{k}" for k in range(len(flat))], flat, problems, 1)
            return "mean_reward", sum(rewards) / len(rewards), len(problems)

        return self.evaluation(min_version, env_steps, measure)

    def on_stop(self) -> None:
        self.backend.close()
        super().on_stop()


def backend_kwargs_for(backend: str, task: Any, model_config: Any = None, model_path: str | None = None,
                       seed: int = 0, config: LLMGeneratorConfig | None = None, lora: Any = None) -> dict[str, Any]:
    """Constructor arguments for a backend by name. The torch backend gets the model description and
    the task's tokenizer (the model's own when the recipe gave the task one: its EOS stops sampling,
    its pad fills finished rows) and the LoRA adapters the trainer trains; vLLM gets the model folder,
    the seed, the dtype and a context that fits the longest prompt plus ``max_new_tokens``."""
    dtype = config.dtype if config is not None else "float32"
    if backend == "torch":
        return {"model_config": model_config, "model_path": model_path, "seed": seed, "tokenizer": task.tokenizer,
                "dtype": dtype, "lora": lora if lora is not None and lora.r > 0 else None}
    out: dict[str, Any] = {"model_path": model_path, "seed": seed, "dtype": dtype}
    if lora is not None and lora.r > 0:
        out["lora"] = lora
    if config is not None and config.max_prompt_tokens is not None:
        out["max_model_len"] = config.max_prompt_tokens + config.max_new_tokens
    return out
