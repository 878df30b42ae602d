"""Multi-turn episodes through the vLLM backend (GPU): stop tokens end a turn, observations are
appended and masked, the prefix of every turn is the previous context (vLLM's prefix cache).
Skips without vLLM and a CUDA GPU (the CPU vLLM venv is exercised by test_vllm_backend.py)."""

from __future__ import annotations

import importlib.util

import pytest

from rlmesh.rl.agentic.env_actor import LocalEnvClient
from rlmesh.rl.agentic.episodes import EpisodeEnd, EpisodeLimits, run_episodes
from rlmesh.rl.agentic.protocol import StepResult, TextEnv
from rlmesh.rl.backends.base import SamplingParams


def _why_not() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed in this venv (pip install -e '.[gpu]' on a CUDA machine)"
    import torch
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    return None


class ThreeTurns(TextEnv):
    def reset(self, task: object) -> str:
        self.n = 0
        return "12+34"

    def step(self, model_text: str) -> StepResult:
        self.n += 1
        return StepResult("+42", 1.0 if self.n == 3 else 0.0, self.n == 3)


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_vllm_multi_turn_episodes(tmp_path):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    from rlmesh.rl.backends.tiny_llama import make_tiny_llama
    from rlmesh.rl.backends.vllm_backend import VLLMBackend
    from rlmesh.rl.models.hf import load_hf

    path = make_tiny_llama(tmp_path / "tiny")
    _, tok = load_hf(str(path))
    backend = VLLMBackend(path, enable_prefix_caching=True)
    stop = tok.encode("=", add_special_tokens=False)[-1]  # the tiny tokenizer knows digits, + and =
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    limits = EpisodeLimits(max_turns=3, max_tokens=60, turn_tokens=8)
    trajs = run_episodes(backend, LocalEnvClient(ThreeTurns), [(f"e{i}", None) for i in range(16)], encode, limits,
                         SamplingParams(stop_token_ids=(stop,)), prompt_prefix=[tok.bos_token_id])
    obs = encode("+42")
    for t in trajs:
        assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask)
        assert t.end in (EpisodeEnd.DONE, EpisodeEnd.MAX_TOKENS)
        pos = 0
        for turn in t.turns:
            model = t.token_ids[pos:pos + turn.tokens_out]
            assert len(model) == turn.tokens_out <= 8 and all(t.loss_mask[pos:pos + turn.tokens_out])
            assert stop not in model[:-1]
            pos += turn.tokens_out
            assert t.token_ids[pos:pos + turn.tokens_in] == obs[:turn.tokens_in] and turn.tokens_in in (0, len(obs))
            assert not any(t.loss_mask[pos:pos + turn.tokens_in])
            pos += turn.tokens_in
    backend.close()
