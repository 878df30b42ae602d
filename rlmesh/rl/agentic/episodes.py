"""The turn-by-turn episode loop: many episodes in flight, the model never waits on one tool.

Each episode alternates: the model generates a turn (until a tool-call stop token, EOS or the
turn's token cap), the environment steps on that text, its observation is appended to the
context, and the model goes on — until the environment says ``done``, ``max_turns`` turns were
taken or ``max_tokens`` tokens follow the prompt. Episodes whose environment answered are
batched into the next generation call while other episodes' tools are still running, so a slow
tool delays only its own episode.

Training needs the whole trajectory as one token sequence: the prompt, then model and
observation tokens interleaved; ``loss_mask`` marks the model's tokens (1) apart from the
observations it only read (0), and each segment of model tokens records the policy version that
sampled it (partial rollouts: weights may change between turns).
"""

from __future__ import annotations

import concurrent.futures
import queue
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Protocol

from rlmesh.rl.agentic.protocol import StepResult
from rlmesh.rl.backends.base import Completion, GenerationBackend, SamplingParams


FIRST_WAIT_S = 0.1
"""After the first reset answers, how long the loop waits for the others before its first call
(it starts at once when all have answered): a late reset would otherwise keep its episode a
call behind the rest for the whole episode."""


@dataclass(frozen=True)
class EpisodeLimits:
    """How long an episode may run."""

    max_turns: int = 4
    """Model turns per episode."""
    max_tokens: int = 64
    """Tokens after the prompt (model and observation tokens together)."""
    turn_tokens: int = 16
    """Tokens one model turn may generate."""

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_tokens", "turn_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"EpisodeLimits.{key}={getattr(self, key)} must be >= 1 (generator.{key})")


class EpisodeEnd(StrEnum):
    """Why an episode stopped."""

    DONE = "done"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"


@dataclass
class Turn:
    """One model turn and the environment's answer: a row of the ``turns`` table."""

    index: int
    text: str
    tokens_out: int
    """Tokens the model generated this turn."""
    tokens_in: int
    """Observation tokens appended after it (0 on the last turn)."""
    reward: float
    policy_version: int
    tool: str | None = None
    args: str | None = None
    tool_latency_s: float | None = None
    error: str | None = None
    env_latency_s: float = 0.0
    """From sending the text to the environment to its answer (tool time plus transport)."""


@dataclass(frozen=True)
class Segment:
    """Model tokens ``[start, end)`` of ``Trajectory.token_ids`` and the weight version that sampled them."""

    start: int
    end: int
    policy_version: int


@dataclass
class Trajectory:
    """One finished episode as training data."""

    episode_id: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    reward: float = 0.0
    end: EpisodeEnd = EpisodeEnd.DONE
    text: str = ""
    """The model's text of the last turn (its final answer when ``end`` is ``done``)."""

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int:
        """The oldest weights that sampled any of its tokens (what a staleness bound checks)."""
        return min((s.policy_version for s in self.segments), default=0)

    def completion(self) -> Completion:
        """The trajectory as the trainers' ``Completion`` (observation tokens masked out of the loss)."""
        return Completion(self.prompt_ids, list(self.token_ids), list(self.logprobs), self.text,
                          "stop" if self.end is EpisodeEnd.DONE else "length", loss_mask=list(self.loss_mask))


class EnvClient(Protocol):
    """How the loop reaches environments: by episode id, with futures (in process or across procs)."""

    def reset(self, episode_id: str, task: Any) -> concurrent.futures.Future:
        """Future of the first observation (``str``)."""

    def step(self, episode_id: str, text: str) -> concurrent.futures.Future:
        """Future of the :class:`~rlmesh.rl.agentic.protocol.StepResult`."""

    def close(self, episode_id: str) -> None:
        """Drop the episode's environment (fire and forget)."""


@dataclass
class _Live:
    traj: Trajectory
    context: list[int]
    ordinal: int = 0  # its place in ``episodes``: a call's rows go in this order (see run_episodes)
    sent_at: float = 0.0


def run_episodes(backend: GenerationBackend, env: EnvClient, episodes: list[tuple[str, Any]],
                 encode: Callable[[str], list[int]], limits: EpisodeLimits, params: SamplingParams,
                 version: Callable[[], int] = lambda: 0, prompt_prefix: list[int] | None = None,
                 decode: Callable[[list[int]], str] | None = None, max_batch: int | None = None) -> list[Trajectory]:
    """Run ``episodes`` (``(episode_id, task)`` pairs) to their ends; trajectories in the same order.

    ``encode`` turns observation text into token ids; ``prompt_prefix`` (a BOS) goes before the
    first observation; ``decode`` gives a turn's text where the backend returns none (the torch
    backend without a tokenizer). ``version()`` is asked before every generation call: a generator that pulls
    newer weights there continues its episodes with them (each :class:`Segment` says which).
    ``max_batch`` caps the episodes of one generation call: with fewer than all, one cohort generates
    while the other's tools run, which hides tool latency that would otherwise idle the model.
    ``params`` gives temperature, top-p and the stop tokens; its ``n`` and ``max_tokens`` are set here.
    An environment's failure (its proc died) is raised, after the other episodes were closed.
    """
    done_q: queue.Queue = queue.Queue()
    live: dict[str, _Live] = {}
    out: dict[str, Trajectory] = {}
    ready: list[_Live] = []

    def watch(eid: str, kind: str, fut: concurrent.futures.Future) -> None:
        fut.add_done_callback(lambda f: done_q.put((eid, kind, f)))

    ordinal = {eid: i for i, (eid, _) in enumerate(episodes)}
    for eid, task in episodes:
        watch(eid, "reset", env.reset(eid, task))
    waiting = len(episodes)
    last_call_s: float | None = None  # how long the last generation call took: sizes the wait for stragglers
    try:
        while waiting or ready:
            # Wait for the first answer; then, while other episodes are still with their environments,
            # keep collecting answers for up to a quarter of a generation call's time: answers to one
            # batch arrive together, and a call for the first few alone would cost a whole call again.
            # Before the first call, the resets get FIRST_WAIT_S: all of them usually arrive well within it.
            deadline = None
            while waiting and (max_batch is None or len(ready) < max_batch):
                if ready and deadline is None:
                    deadline = time.perf_counter() + (last_call_s / 4 if last_call_s is not None else FIRST_WAIT_S)
                left = None if deadline is None else deadline - time.perf_counter()
                try:
                    eid, kind, fut = done_q.get(timeout=left) if left is None or left > 0 else done_q.get_nowait()
                except queue.Empty:
                    break
                waiting -= 1
                result = fut.result()  # an environment proc's death surfaces here
                if kind == "reset":
                    prompt = list(prompt_prefix or []) + encode(result)
                    ep = live[eid] = _Live(Trajectory(eid, prompt), list(prompt), ordinal[eid])
                    ready.append(ep)
                elif _absorb(live[eid], result, encode, limits, time.perf_counter()):
                    ready.append(live[eid])
                else:
                    out[eid] = live.pop(eid).traj
                    env.close(eid)
            if not ready:
                continue
            v = version()
            take, ready = (ready, []) if max_batch is None else (ready[:max_batch], ready[max_batch:])
            # Rows in a fixed order, not the order the environments answered in: a cohort taking its
            # next turn has the rows of its last call, so the torch backend writes on in that call's
            # cache (no copy), and neighbours that are not a whole call are still seeded as one block
            # copy per layer instead of a copy per row (35 ms -> a few ms a call at B = 64).
            take.sort(key=lambda ep: ep.ordinal)
            by_cap: dict[int, list[_Live]] = {}
            for ep in take:
                cap = min(limits.turn_tokens, limits.max_tokens - len(ep.traj.token_ids))
                by_cap.setdefault(cap, []).append(ep)
            for cap, group in by_cap.items():
                p = SamplingParams(n=1, max_tokens=cap, temperature=params.temperature, top_p=params.top_p,
                                   seed=params.seed, stop_token_ids=params.stop_token_ids)
                t0 = time.perf_counter()
                comps = backend.generate([ep.context for ep in group], p)
                last_call_s = time.perf_counter() - t0
                for ep, (c,) in zip(group, comps):
                    t = ep.traj
                    start = len(t.token_ids)
                    t.token_ids += c.token_ids
                    t.logprobs += c.logprobs
                    t.loss_mask += [1] * len(c.token_ids)
                    t.segments.append(Segment(start, len(t.token_ids), v))
                    ep.context += c.token_ids
                    t.text = c.text if c.text or decode is None else decode(c.token_ids)
                    t.turns.append(Turn(len(t.turns), t.text, len(c.token_ids), 0, 0.0, v))
                    ep.sent_at = time.perf_counter()
                    watch(t.episode_id, "step", env.step(t.episode_id, t.text))
                    waiting += 1
    except BaseException:
        for eid in live:
            env.close(eid)
        raise
    return [out[eid] for eid, _ in episodes]


def _absorb(ep: _Live, r: StepResult, encode: Callable[[str], list[int]], limits: EpisodeLimits,
            now: float) -> bool:
    """Fold a step's result into the episode; ``True`` if the model takes another turn."""
    t = ep.traj
    turn = t.turns[-1]
    turn.reward, turn.env_latency_s = float(r.reward), now - ep.sent_at
    if r.tool is not None:
        turn.tool, turn.args, turn.tool_latency_s, turn.error = r.tool.tool, r.tool.args, r.tool.latency_s, r.tool.error
    t.reward += float(r.reward)
    if r.done:
        t.end = EpisodeEnd.DONE
        return False
    obs = encode(r.observation) if r.observation else []
    if len(t.turns) >= limits.max_turns:
        t.end = EpisodeEnd.MAX_TURNS
        return False
    if len(t.token_ids) + len(obs) >= limits.max_tokens:
        t.end = EpisodeEnd.MAX_TOKENS
        return False
    turn.tokens_in = len(obs)
    t.token_ids += obs
    t.logprobs += [0.0] * len(obs)
    t.loss_mask += [0] * len(obs)
    ep.context += obs
    return True
