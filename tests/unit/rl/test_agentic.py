"""Pure logic of agentic rollouts: the episode loop on a real tiny torch model with in-process
environments, the loss mask through batching and GRPO, stop tokens, tool timeouts in a thread."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlmesh.errors import ConfigError
from rlmesh.rl.agentic.calculator import CalculatorEnv, MulProblem, MultiplicationTask, calculate
from rlmesh.rl.agentic.config import AgenticGeneratorConfig, EnvConfig
from rlmesh.rl.agentic.env_actor import LocalEnvClient
from rlmesh.rl.agentic.episodes import EpisodeEnd, EpisodeLimits, run_episodes
from rlmesh.rl.agentic.protocol import StepResult, TextEnv
from rlmesh.rl.agentic.tools import Tool, ToolError, ToolLimits, run_tool
from rlmesh.rl.backends.base import Completion, SamplingParams
from rlmesh.rl.backends.torch_backend import TorchBackend
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.config import GRPOConfig
from rlmesh.rl.algorithms.grpo import ScoredBatch, grpo_update
from rlmesh.rl.models.sampling import generate
from rlmesh.rl.models.transformer import Transformer, TransformerConfig

TASK = MultiplicationTask(2, 2)
TOK = TASK.tokenizer


def tiny_backend(seed: int = 0) -> TorchBackend:
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(vocab_size=TOK.vocab_size, max_seq_len=40, d_model=32, n_layers=1, n_heads=2))
    return TorchBackend(model, eos_id=TOK.eos_id, pad_id=TOK.pad_id, seed=seed)


class EchoEnv(TextEnv):
    """Every turn gets the observation '(12)' and reward 0.5; the third turn ends the episode."""

    def reset(self, task: object) -> str:
        self.turns = 0
        return "12*34="

    def step(self, model_text: str) -> StepResult:
        self.turns += 1
        return StepResult("(12)", 0.5, self.turns == 3)


def params() -> SamplingParams:
    return SamplingParams(stop_token_ids=TASK.stop_token_ids)


def test_trajectory_interleaves_model_and_masked_observation_tokens_and_sums_turn_rewards():
    env = LocalEnvClient(EchoEnv)
    limits = EpisodeLimits(max_turns=5, max_tokens=30, turn_tokens=4)
    trajs = run_episodes(tiny_backend(), env, [("a", None), ("b", None)], TOK.encode, limits, params(),
                         version=lambda: 7, prompt_prefix=[TOK.BOS], decode=TOK.decode)
    obs = TOK.encode("(12)")
    for t in trajs:
        assert t.end is EpisodeEnd.DONE and len(t.turns) == 3 and t.reward == pytest.approx(1.5)
        assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask)
        assert t.prompt_ids == [TOK.BOS] + TOK.encode("12*34=")
        # observation tokens follow each of the first two turns, masked out and with zero log-prob
        pos = 0
        for turn in t.turns:
            assert t.loss_mask[pos:pos + turn.tokens_out] == [1] * turn.tokens_out
            pos += turn.tokens_out
            assert turn.tokens_in == (len(obs) if turn.index < 2 else 0)
            assert t.token_ids[pos:pos + turn.tokens_in] == obs[:turn.tokens_in]
            assert t.loss_mask[pos:pos + turn.tokens_in] == [0] * turn.tokens_in
            assert t.logprobs[pos:pos + turn.tokens_in] == [0.0] * turn.tokens_in
            pos += turn.tokens_in
        assert pos == len(t.token_ids)
        assert [(s.end - s.start, s.policy_version) for s in t.segments] == [(x.tokens_out, 7) for x in t.turns]
        c = t.completion()
        assert c.loss_mask == t.loss_mask and c.finish_reason == "stop"
    env.shutdown()


def test_episode_limits_end_episodes():
    limits = EpisodeLimits(max_turns=2, max_tokens=30, turn_tokens=4)
    (t,) = run_episodes(tiny_backend(), LocalEnvClient(EchoEnv), [("a", None)], TOK.encode, limits, params(),
                        prompt_prefix=[TOK.BOS], decode=TOK.decode)
    assert t.end is EpisodeEnd.MAX_TURNS and len(t.turns) == 2
    (t,) = run_episodes(tiny_backend(), LocalEnvClient(EchoEnv), [("a", None)], TOK.encode,
                        EpisodeLimits(max_turns=9, max_tokens=9, turn_tokens=4), params(), decode=TOK.decode)
    assert t.end is EpisodeEnd.MAX_TOKENS and len(t.token_ids) <= 9


def test_a_slow_tool_does_not_stall_other_episodes():
    """Episode 'slow' waits in its step until episode 'fast' has finished all its turns: a loop that
    waited for every step of a round before generating again would deadlock here (the test times out)."""
    fast_done = threading.Event()

    class Env(EchoEnv):
        def reset(self, task: str) -> str:
            self.name = task
            return super().reset(task)

        def step(self, model_text: str) -> StepResult:
            if self.name == "slow":
                assert fast_done.wait(30), "the fast episode never finished while the slow tool ran"
            return super().step(model_text)

        def close(self) -> None:
            if self.name == "fast":
                fast_done.set()

    env = LocalEnvClient(Env)
    trajs = run_episodes(tiny_backend(), env, [("s", "slow"), ("f", "fast")], TOK.encode,
                         EpisodeLimits(max_turns=3, max_tokens=30, turn_tokens=4), params(), decode=TOK.decode)
    assert [len(t.turns) for t in trajs] == [3, 3]


def test_environment_failure_is_raised_and_episodes_closed():
    closed = []

    class Env(EchoEnv):
        def step(self, model_text: str) -> StepResult:
            raise RuntimeError("env broke")

        def close(self) -> None:
            closed.append(1)

    env = LocalEnvClient(Env)
    with pytest.raises(RuntimeError, match="env broke"):
        run_episodes(tiny_backend(), env, [("a", None), ("b", None)], TOK.encode, EpisodeLimits(), params(),
                     decode=TOK.decode)
    env.pool.shutdown(wait=True)
    assert len(closed) == 2


def test_stop_token_ends_a_row_and_is_kept():
    model = tiny_backend().model
    stop = TASK.stop_token_ids[0]
    gen = generate(model, [[TOK.BOS, 5]], n=64, max_new_tokens=12, eos_id=TOK.eos_id, stop_ids=(stop,),
                   generator=torch.Generator().manual_seed(0))
    ends = []
    for row, mask in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist()):
        n = sum(mask)
        assert stop not in row[:n - 1] and TOK.eos_id not in row[:n - 1]
        ends.append(row[n - 1])
    assert stop in ends  # some rows did stop at the tool-call token (and kept it)


def test_observation_tokens_never_reach_the_loss():
    """The same batch with garbage behaviour log-probs on the observation tokens trains identically."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=TOK.vocab_size, max_seq_len=24, d_model=32, n_layers=1, n_heads=2))
    rows = [Completion([1, 5, 6], [7, 8, 9, 10, 11], [-1.0, -1.1, 0.0, 0.0, -0.9], loss_mask=[1, 1, 0, 0, 1]),
            Completion([1, 5, 6], [7, 9, 9, 10, 12], [-1.2, -1.0, 0.0, 0.0, -0.8], loss_mask=[1, 1, 0, 0, 1])]
    gen = completions_to_generation(rows, 0)
    assert gen.trained_mask.tolist() == [[1, 1, 0, 0, 1]] * 2
    garbage = [Completion(c.prompt_ids, c.token_ids, [lp if m else -50.0 for lp, m in zip(c.logprobs, c.loss_mask)],
                          loss_mask=c.loss_mask) for c in rows]
    cfg = GRPOConfig(lr=1e-2)
    outs = []
    for batch in (rows, garbage):
        m = Transformer(model.config)
        m.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        grpo_update(m, opt, ScoredBatch([], completions_to_generation(batch, 0), torch.tensor([1.0, 0.0]), []), cfg, 2)
        outs.append(torch.cat([p.flatten() for p in m.parameters()]))
    assert torch.allclose(outs[0], outs[1])
    plain = completions_to_generation([Completion([1], [4, 5], [-1.0, -1.0])], 0)
    assert plain.loss_mask is None and plain.trained_mask is plain.completion_mask


def test_in_process_tool_timeout_and_exception_become_errors():
    never = threading.Event()
    hung = Tool("hung", lambda a: str(never.wait(60)), isolate=False)
    t0 = time.monotonic()
    r = run_tool(hung, "", ToolLimits(timeout_s=0.2))
    assert r.error and r.error.startswith(ToolError.TIMEOUT) and r.output == ""
    assert time.monotonic() - t0 < 10
    never.set()
    r = run_tool(Tool("calc", calculate, isolate=False), "12*x", ToolLimits())
    assert r.error and r.error.startswith(ToolError.EXCEPTION) and "6 digits" in r.error


def test_calculator_env_episode_and_bad_calls():
    env = CalculatorEnv()
    assert env.reset(MulProblem("47*38=", "1786")) == "47*38="
    r = env.step("[47*38]")
    assert (r.observation, r.done, r.tool.tool, r.tool.args, r.tool.error) == ("(1786)", False, "calculator", "47*38", None)
    bad = env.step("[47*]")
    assert bad.observation == "(?)" and bad.tool.error.startswith(ToolError.EXCEPTION)
    assert env.step("1786").reward == 1.0 and env.step("1787").reward == 0.0
    off = CalculatorEnv(tools=False)
    off.reset(MulProblem("47*38=", "1786"))
    r = off.step("[47*38]")
    assert r.observation == "(?)" and r.tool.error.startswith("unknown tool")


def test_configs_name_the_key():
    with pytest.raises(ConfigError, match="generator.max_turns"):
        AgenticGeneratorConfig(max_turns=0)
    with pytest.raises(ConfigError, match="generator.max_episode_tokens"):
        AgenticGeneratorConfig(max_new_tokens=16, max_episode_tokens=8)
    with pytest.raises(ConfigError, match="env.cls"):
        EnvConfig(cls="CalculatorEnv")
    with pytest.raises(ValueError, match="EpisodeLimits.turn_tokens"):
        EpisodeLimits(turn_tokens=0)


def test_partial_rollouts_record_the_version_of_each_segment():
    """Weights that change between turns continue the episode; each segment and turn says which
    version sampled it, and the staleness check reads the oldest."""
    calls = []

    def version() -> int:  # a new version before every generation call
        calls.append(1)
        return len(calls) - 1

    (t,) = run_episodes(tiny_backend(), LocalEnvClient(EchoEnv), [("a", None)], TOK.encode,
                        EpisodeLimits(max_turns=5, max_tokens=30, turn_tokens=4), params(), version=version,
                        decode=TOK.decode)
    assert [s.policy_version for s in t.segments] == [0, 1, 2] == [turn.policy_version for turn in t.turns]
    assert t.oldest_version == 0
    assert sum(s.end - s.start for s in t.segments) == t.model_tokens


def test_answers_arriving_close_together_share_a_generation_call():
    """Sixteen episodes whose tools answer 0.5 ms apart: the loop waits a little (a quarter of a call's
    time) for the stragglers instead of starting a call for the first few, which would cost a whole
    call again and split the episodes into ever smaller batches."""
    backend = tiny_backend()
    calls: list[int] = []
    generate_one = backend.generate

    def counting(prompts, p):  # a model whose calls take 0.6 s, as a bigger one's would
        calls.append(len(prompts))
        time.sleep(0.6)
        return generate_one(prompts, p)

    backend.generate = counting

    class Staggered(EchoEnv):
        def reset(self, task: int) -> str:
            self.delay = task * 0.0005
            return super().reset(task)

        def step(self, model_text: str) -> StepResult:
            time.sleep(self.delay)
            return super().step(model_text)

    env = LocalEnvClient(Staggered, max_workers=16)
    trajs = run_episodes(backend, env, [(f"e{i}", i) for i in range(16)], TOK.encode,
                         EpisodeLimits(max_turns=3, max_tokens=30, turn_tokens=4), SamplingParams(), decode=TOK.decode)
    env.shutdown()
    assert all(len(t.turns) == 3 for t in trajs) and sum(calls) == 48
    assert len(calls) <= 4, f"{len(calls)} generation calls of sizes {calls}: answers were not coalesced"


def test_max_batch_caps_every_generation_call_and_runs_cohorts_to_the_end():
    """``generator.max_batch``: sixteen episodes in calls of at most four, every episode still
    played to its end; the config refuses a negative size and names the key."""
    backend = tiny_backend()
    calls: list[int] = []
    generate_one = backend.generate

    def counting(prompts, p):
        calls.append(len(prompts))
        return generate_one(prompts, p)

    backend.generate = counting
    env = LocalEnvClient(EchoEnv, max_workers=16)
    trajs = run_episodes(backend, env, [(f"e{i}", None) for i in range(16)], TOK.encode,
                         EpisodeLimits(max_turns=3, max_tokens=30, turn_tokens=4), params(), decode=TOK.decode,
                         max_batch=4)
    env.shutdown()
    assert [t.episode_id for t in trajs] == [f"e{i}" for i in range(16)]
    assert all(len(t.turns) == 3 for t in trajs) and sum(calls) == 48
    assert max(calls) == 4, f"calls of sizes {calls}"
    with pytest.raises(ConfigError, match="generator.max_batch"):
        AgenticGeneratorConfig(max_batch=-1)


def test_a_calls_rows_follow_the_episodes_order_not_the_order_tools_answered_in():
    """Tools answer in reverse order; each call still lists its episodes in their given order, so
    neighbours in one call are neighbours in the next and the prefix cache seeds them as one block."""
    backend = tiny_backend()
    orders: list[list[str]] = []
    generate_one = backend.generate
    by_prompt: dict[tuple, str] = {}

    def recording(prompts, p):
        orders.append([by_prompt[tuple(pr[:4])] for pr in prompts])
        return generate_one(prompts, p)

    backend.generate = recording

    class Reversed(EchoEnv):
        def reset(self, task: int) -> str:
            super().reset(task)
            self.delay = (8 - task) * 0.01  # episode 7 answers first, episode 0 last
            time.sleep(self.delay)
            return f"{task}*34="

        def step(self, model_text: str) -> StepResult:
            time.sleep(self.delay)
            return super().step(model_text)

    for i in range(8):
        by_prompt[tuple([TOK.BOS] + TOK.encode(f"{i}*34=")[:3])] = f"e{i}"
    env = LocalEnvClient(Reversed, max_workers=8)
    run_episodes(backend, env, [(f"e{i}", i) for i in range(8)], TOK.encode,
                 EpisodeLimits(max_turns=3, max_tokens=30, turn_tokens=4), SamplingParams(),
                 prompt_prefix=[TOK.BOS], decode=TOK.decode)
    env.shutdown()
    assert orders and all(o == sorted(o, key=lambda e: int(e[1:])) for o in orders), orders
