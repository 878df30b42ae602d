"""Model-folder pieces on a tiny random Llama made in the test (the real model's checks are in
tests/integration/llm): the tokenizer contract, gradient checkpointing, LoRA, the export, and the
learning-rate schedule."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from rlmesh.rl.algorithms.grpo import GRPOTrainer
from rlmesh.rl.backends.tiny_llama import make_tiny_llama
from rlmesh.rl.config import GRPOConfig, LoRAConfig
from rlmesh.rl.models.hf import BaseOf, HFTokenizer, adapter_state_dict, apply_lora, is_lora, load_hf, save_folder
from rlmesh.rl.models.sampling import sequence_logprobs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


def _batch():
    ids = torch.tensor([[0, 1, 5, 6, 7, 8, 9], [1, 5, 6, 7, 8, 9, 10]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    return ids, mask


def test_the_tokenizer_travels_by_path_and_follows_the_contract(tiny):
    tok = HFTokenizer(tiny)
    copy = pickle.loads(pickle.dumps(tok))
    assert copy.path == str(tiny) and copy._tok is None  # loaded on first use, in the proc that uses it
    ids = copy.render("12+3=")  # no chat template: plain text
    assert copy.decode(ids) == "12+3=" and copy.eos_id == 2 and copy.pad_id == 0
    assert copy.decode(ids + [copy.eos_id] + ids) == "12+3="  # stops at the first EOS


def test_gradient_checkpointing_gives_the_same_gradients(tiny):
    grads = []
    for ckpt in (False, True):
        model, _ = load_hf(tiny)
        model.train()
        if ckpt:
            model.gradient_checkpointing_enable()
            assert model.model.is_gradient_checkpointing
        ids, mask = _batch()
        sequence_logprobs(model, ids, mask, 3).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_lora_trains_adapters_only_and_its_reference_is_the_base_model(tiny, tmp_path):
    base, _ = load_hf(tiny)
    model = apply_lora(load_hf(tiny)[0], LoRAConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert is_lora(model) and not is_lora(base)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    adapters = adapter_state_dict(model)
    assert set(adapters) and all("lora_" in k for k in adapters)
    ids, mask = _batch()
    with torch.no_grad():
        for k, v in adapters.items():  # a trained adapter: B is no longer zero
            if "lora_B" in k:
                v.normal_(0, 0.5)
        lora_out, ref_out, base_out = model(ids, mask), BaseOf(model)(ids, mask), base(ids, mask)
    assert torch.allclose(ref_out, base_out, atol=1e-5)  # adapters off: the starting policy, no second copy
    assert not torch.allclose(lora_out, base_out, atol=1e-3)
    folder = save_folder(model, tmp_path / "export", HFTokenizer(tiny))
    merged, tok = load_hf(folder)
    assert tok is not None and not is_lora(merged)
    with torch.no_grad():
        assert torch.allclose(merged(ids, mask), lora_out, atol=1e-4)  # the adapters merged in


def test_learning_rate_warms_up_then_decays_to_zero():
    def lr(step, **kw):
        return GRPOTrainer.learning_rate(SimpleNamespace(config=GRPOConfig(lr=1.0, **kw)), step)

    assert [lr(s) for s in (0, 50, 99)] == [1.0, 1.0, 1.0]
    assert [lr(s, warmup_steps=4) for s in (0, 1, 3, 10)] == [0.25, 0.5, 1.0, 1.0]
    assert [lr(s, lr_schedule="linear", lr_decay_steps=10) for s in (0, 5, 10, 20)] == [1.0, 0.5, 0.0, 0.0]
    cos = [lr(s, lr_schedule="cosine", warmup_steps=2, lr_decay_steps=12) for s in (1, 2, 7, 12)]
    assert cos[0] == 1.0 and cos[1] == 1.0 and cos[2] == pytest.approx(0.5) and cos[3] == pytest.approx(0.0)
