"""The in-process GRPO building blocks on the addition task, with a tiny real transformer."""

import random

import pytest
import torch

from rlmesh.rl.config import GRPOConfig, LLMGeneratorConfig
from rlmesh.rl.algorithms.grpo import (ScoredBatch, evaluate_heldout, frozen_copy, generate_and_score, grpo_update,
                                       sft_warmstart)
from rlmesh.rl.models.sampling import Generation
from rlmesh.rl.models import Transformer, TransformerConfig, sequence_logprobs
from rlmesh.rl.tasks import AdditionTask


@pytest.fixture
def setup():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = AdditionTask(1, 1)
    model = Transformer(TransformerConfig(vocab_size=task.tokenizer.vocab_size, max_seq_len=16, d_model=32,
                                          n_layers=1, n_heads=2))
    return task, model


def test_generate_and_score_groups_rows_and_uses_the_verifier(setup):
    task, model = setup
    problems = task.sample(3, random.Random(0))
    batch = generate_and_score(model, task, problems, LLMGeneratorConfig(samples_per_prompt=4, max_new_tokens=3),
                               torch.Generator().manual_seed(0))
    assert batch.rewards.shape == (12,) and len(batch.texts) == 12
    for i, text in enumerate(batch.texts):
        assert batch.rewards[i] == task.score(text, problems[i // 4])


def test_sft_warmstart_lowers_the_answer_loss(setup):
    task, model = setup
    losses = sft_warmstart(model, task, steps=40, batch_size=16, lr=3e-3)
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10


def test_grpo_update_moves_probability_towards_rewarded_completions(setup):
    task, model = setup
    problems = task.sample(4, random.Random(1))
    config = LLMGeneratorConfig(samples_per_prompt=8, max_new_tokens=3)
    batch = generate_and_score(model, task, problems, config, torch.Generator().manual_seed(0))
    # Give half of each group reward 1 so every group is informative, whatever the model knows.
    batch.rewards = torch.tensor([1.0, 0.0] * 16)
    gen = batch.generation

    def seq_logp():
        with torch.no_grad():
            lp = sequence_logprobs(model, gen.input_ids, gen.attention_mask, gen.prompt_len)
        return (lp * gen.completion_mask).sum(1)

    before = seq_logp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    metrics = grpo_update(model, opt, batch, GRPOConfig(lr=1e-2, kl_coef=0.1), group_size=8,
                          ref_model=frozen_copy(model))
    delta = seq_logp() - before
    assert metrics["train/informative_fraction"] == 1.0 and metrics["losses/approx_kl"] < 1e-6  # on-policy ratio
    assert delta[0::2].mean() > delta[1::2].mean()


def test_grpo_update_skips_uninformative_batches_and_needs_a_reference_for_kl(setup):
    task, model = setup
    batch = generate_and_score(model, task, task.sample(2, random.Random(2)),
                               LLMGeneratorConfig(samples_per_prompt=4, max_new_tokens=3))
    batch.rewards = torch.zeros(8)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters())
    assert grpo_update(model, opt, batch, GRPOConfig(), 4) == {"train/informative_fraction": 0.0}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="kl_coef"):
        grpo_update(model, opt, batch, GRPOConfig(kl_coef=0.1), 4)


def test_heldout_eval_is_greedy_and_deterministic(setup):
    task, model = setup
    held = task.sample(20, random.Random(3), "heldout")
    assert evaluate_heldout(model, task, held) == evaluate_heldout(model, task, held)


def test_max_groups_trains_on_the_first_informative_groups_only(setup):
    task, model = setup
    batch = generate_and_score(model, task, task.sample(4, random.Random(4)),
                               LLMGeneratorConfig(samples_per_prompt=2, max_new_tokens=3))
    batch.rewards = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0])  # groups 1 and 3 informative
    opt = torch.optim.Adam(model.parameters())
    metrics = grpo_update(model, opt, batch, GRPOConfig(), 2, max_groups=1)
    assert metrics["train/informative_fraction"] == 0.5 and metrics["train/groups"] == 1.0


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "sequence_sum_norm"])
def test_micro_batches_accumulate_the_full_batch_gradient(setup, aggregation):
    """``trainer.micro_batch_size``: the same update as the whole batch at once (less memory), for each
    way of averaging tokens, KL term included."""
    task, model = setup
    problems = task.sample(4, random.Random(2))
    batch = generate_and_score(model, task, problems, LLMGeneratorConfig(samples_per_prompt=4, max_new_tokens=3),
                               torch.Generator().manual_seed(1))
    batch.rewards = torch.tensor([1.0, 0.0, 0.5, 0.0] * 4)
    ref = frozen_copy(model)
    grads, metrics = [], []
    for size in (None, 3):
        m = frozen_copy(model).train()
        for p in m.parameters():
            p.requires_grad_(True)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)  # lr 0: compare the gradients the step produced
        cfg = GRPOConfig(kl_coef=0.05, aggregation=aggregation, micro_batch_size=size, max_grad_norm=1e9)
        metrics.append(grpo_update(m, opt, batch, cfg, group_size=4, ref_model=ref))
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert metrics[0]["losses/loss"] == pytest.approx(metrics[1]["losses/loss"], rel=1e-4, abs=1e-7)
    assert metrics[0]["train/tokens"] == metrics[1]["train/tokens"] > 0


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_unanimous_groups_count_in_the_average_as_zeros(setup, aggregation):
    """The loss is the whole batch's mean (TRL's ``dapo`` and ``grpo`` losses): adding a unanimous group
    scales the gradient by the share of the batch the informative group is, without changing its direction."""
    task, model = setup
    batch = generate_and_score(model, task, task.sample(2, random.Random(5)),
                               LLMGeneratorConfig(samples_per_prompt=4, max_new_tokens=3),
                               torch.Generator().manual_seed(2))
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # group 1 unanimous
    gen = batch.generation
    half = ScoredBatch(batch.problems[:1], Generation(gen.input_ids[:4], gen.attention_mask[:4], gen.completion_ids[:4],
                                                      gen.completion_logprobs[:4], gen.completion_mask[:4],
                                                      gen.prompt_len), batch.rewards[:4], batch.texts[:4])
    grads, metrics = [], []
    for b in (batch, half):
        m = frozen_copy(model).train().requires_grad_(True)
        cfg = GRPOConfig(aggregation=aggregation, max_grad_norm=1e9)
        metrics.append(grpo_update(m, torch.optim.SGD(m.parameters(), lr=0.0), b, cfg, group_size=4))
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    mask = gen.completion_mask.float()
    share = float(mask[:4].sum() / mask.sum()) if aggregation == "token_mean" else 0.5
    assert 0 < share < 1 and metrics[0]["train/groups"] == 1.0
    torch.testing.assert_close(grads[0], grads[1] * share, atol=1e-7, rtol=1e-4)
    assert metrics[0]["losses/loss"] == pytest.approx(metrics[1]["losses/loss"], rel=1e-4, abs=1e-7)  # trained rows' mean
