"""THE learning test of agentic rollouts: GRPO on multi-turn calculator episodes teaches the small
transformer to call the tool, and held-out accuracy rises; the same model without the tool
scores near zero (it cannot multiply in its head). In process, no procs: ~1 min on a loaded
2-core host, the smallest budget that still shows it."""

from __future__ import annotations

import random

import pytest
import torch

from rlmesh.rl.agentic.calculator import CalculatorEnv, MultiplicationTask
from rlmesh.rl.agentic.env_actor import LocalEnvClient
from rlmesh.rl.agentic.episodes import EpisodeLimits
from rlmesh.rl.agentic.training import heldout_accuracy, sft_on_demonstrations, train_grpo
from rlmesh.rl.backends.torch_backend import TorchBackend
from rlmesh.rl.models.transformer import Transformer, TransformerConfig


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model is faster on one thread than fighting for two
    yield
    torch.set_num_threads(before)


@pytest.mark.timeout(300)
def test_grpo_on_tool_episodes_learns_to_call_the_calculator(one_thread):
    task = MultiplicationTask(2, 2)
    limits = EpisodeLimits(max_turns=3, max_tokens=task.max_episode_tokens(), turn_tokens=10)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=task.tokenizer.vocab_size,
                                          max_seq_len=task.max_prompt_len() + limits.max_tokens,
                                          d_model=64, n_layers=2, n_heads=4))
    # warm start: a third of the demonstrations use the tool, so the policy sometimes does
    sft_on_demonstrations(model, task, 120, tool_fraction=0.35, batch_size=32, lr=3e-3)
    backend = TorchBackend(model, eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id, seed=0)
    tools, no_tools = LocalEnvClient(CalculatorEnv), LocalEnvClient(CalculatorEnv, {"tools": False})
    heldout = task.sample(100, random.Random(1), "heldout")
    model.eval()
    start_acc, start_use = heldout_accuracy(backend, tools, task, heldout, limits)
    train_grpo(model, backend, tools, task, 6, limits)
    acc, use = heldout_accuracy(backend, tools, task, heldout, limits)
    blind, _ = heldout_accuracy(backend, no_tools, task, heldout, limits)
    assert use >= 0.9 and use > start_use, (start_use, use)
    assert round(acc * 100) >= round(start_acc * 100) + 10, (start_acc, acc)  # ten points or more, counted
    # in episodes: float32 means make 66 -> 76 of 100 read as 0.6600000262 -> 0.7599999905, short of +0.1
    assert blind <= 0.1 < acc, (blind, acc)
