"""The sampler's shortcuts (:func:`rlmesh.rl.models.sampling.generate`), for the built-in transformer
and a Hugging Face model: a group's samples read their shared prompt once, and draw the tokens and
log-probs of reading it once per sample (the trainer's full-sequence log-probs still agree); greedy
decoding (a nucleus of one token) takes the argmax without a sort or a draw."""

from __future__ import annotations

import pytest
import torch

from rlmesh.rl.backends.tiny_llama import make_tiny_llama
from rlmesh.rl.models import Transformer, TransformerConfig, sequence_logprobs
from rlmesh.rl.models.hf import load_hf
from rlmesh.rl.models.sampling import draw, generate

PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [5, 4, 3, 9, 9, 9, 2]]  # uneven: left padding differs per group


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    built_in = Transformer(TransformerConfig(vocab_size=16, max_seq_len=32, d_model=32, n_layers=2, n_heads=2))
    llama, _ = load_hf(make_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama"))
    return {"transformer": built_in.eval(), "llama": llama.eval()}


@pytest.mark.parametrize("name", ["transformer", "llama"])
def test_a_prompt_read_once_samples_as_if_read_per_sample(models, name):
    model, n = models[name], 4
    shared = generate(model, PROMPTS, n=n, max_new_tokens=6, eos_id=None, generator=torch.Generator().manual_seed(3))
    # the same rows (prompt i at rows i * n .. i * n + n - 1), each prompt read once per row
    per_row = generate(model, [p for p in PROMPTS for _ in range(n)], n=1, max_new_tokens=6, eos_id=None,
                       generator=torch.Generator().manual_seed(3))
    assert shared.completion_ids.shape == (len(PROMPTS) * n, 6)
    assert torch.equal(shared.completion_ids, per_row.completion_ids)
    assert torch.equal(shared.input_ids, per_row.input_ids) and torch.equal(shared.attention_mask, per_row.attention_mask)
    torch.testing.assert_close(shared.completion_logprobs, per_row.completion_logprobs, atol=1e-5, rtol=0)
    # a group's samples differ (the copies are independent rows, not one row n times)
    assert any(not torch.equal(shared.completion_ids[0], shared.completion_ids[j]) for j in range(1, n))
    full = sequence_logprobs(model, shared.input_ids, shared.attention_mask, shared.prompt_len)
    torch.testing.assert_close(full * shared.completion_mask, shared.completion_logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["transformer", "llama"])
def test_last_only_is_the_last_column_of_the_full_logits(models, name):
    model = models[name]
    ids = torch.tensor([[0, 3, 4, 5], [6, 7, 8, 9]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad():
        full, last = model(ids, mask), model(ids, mask, last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    torch.testing.assert_close(last[:, 0], full[:, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["transformer", "llama"])
def test_greedy_sampling_is_the_argmax_of_each_step(models, name):
    model = models[name]
    gen = generate(model, PROMPTS, n=1, max_new_tokens=5, top_p=1e-9, eos_id=None, generator=torch.Generator().manual_seed(0))
    ids, mask = gen.input_ids[:, :gen.prompt_len], gen.attention_mask[:, :gen.prompt_len]
    with torch.no_grad():
        for t in range(5):  # the reference: argmax of a full forward pass over everything so far
            nxt = model(ids, mask)[:, -1].argmax(-1)
            assert torch.equal(gen.completion_ids[:, t], nxt)
            ids, mask = torch.cat([ids, nxt[:, None]], 1), torch.cat([mask, torch.ones_like(nxt)[:, None]], 1)


def test_a_draw_follows_the_distribution_and_never_picks_a_zero():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0, 0.0]]).repeat(4000, 1)
    tokens = draw(probs, torch.Generator().manual_seed(0)).view(4000, 2)
    counts = torch.bincount(tokens[:, 0], minlength=5).double() / 4000
    torch.testing.assert_close(counts, torch.tensor([0.0, 0.5, 0.0, 0.25, 0.25], dtype=torch.float64), atol=0.03, rtol=0)
    assert counts[0] == counts[2] == 0 and bool((tokens[:, 1] == 0).all())
