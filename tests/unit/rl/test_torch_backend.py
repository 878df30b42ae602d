"""The torch backend keeps the backend contract, and completions convert back to exactly the tensors
the trainer would have seen from the in-process sampler (so GRPO's ratio is 1 at the first step)."""

import torch

from rlmesh.rl.backends.base import GenerationBackend, SamplingParams, make_backend
from rlmesh.rl.backends.torch_backend import TorchBackend
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.models import Transformer, TransformerConfig, sequence_logprobs
from rlmesh.rl.tasks import AdditionTask


def backend() -> tuple[TorchBackend, AdditionTask]:
    task = AdditionTask(1, 2)
    tok = task.tokenizer
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=tok.vocab_size, max_seq_len=16, d_model=32, n_layers=1, n_heads=2)
    return make_backend("torch", model_config=cfg, eos_id=tok.eos_id, pad_id=tok.pad_id, tokenizer=tok), task


def test_contract_and_shapes():
    b, task = backend()
    assert isinstance(b, GenerationBackend) and b.logprobs_exact
    prompts = [task.encode_prompt(p) for p in task.sample(3, __import__("random").Random(0))]
    out = b.generate(prompts, SamplingParams(n=4, max_tokens=5, seed=1))
    assert [len(g) for g in out] == [4, 4, 4]
    for prompt, group in zip(prompts, out):
        for c in group:
            assert c.prompt_ids == prompt and 1 <= len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids)
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == task.tokenizer.eos_id)
            assert c.text == task.tokenizer.decode(c.token_ids)


def test_seeded_calls_repeat():
    b, task = backend()
    prompts = [task.encode_prompt(p) for p in task.sample(2, __import__("random").Random(1))]
    p = SamplingParams(n=3, max_tokens=4, seed=7)
    first = [c.token_ids for g in b.generate(prompts, p) for c in g]
    assert first == [c.token_ids for g in b.generate(prompts, p) for c in g]


def test_converted_batch_reproduces_the_logprobs():
    b, task = backend()
    prompts = [task.encode_prompt(p) for p in task.sample(4, __import__("random").Random(2))]
    rows = [c for g in b.generate(prompts, SamplingParams(n=2, max_tokens=4, seed=3)) for c in g]
    gen = completions_to_generation(rows, task.tokenizer.pad_id)
    again = sequence_logprobs(b.model, gen.input_ids, gen.attention_mask, gen.prompt_len) * gen.completion_mask
    assert torch.allclose(again, gen.completion_logprobs, atol=1e-5)
    assert int(gen.completion_mask.sum()) == sum(len(c.token_ids) for c in rows)


def test_weight_target_is_updated_in_place():
    b, _ = backend()
    target = b.weight_target()
    ptr = {k: v.data_ptr() for k, v in target.items()}
    fresh = Transformer(b.model.config).state_dict()
    for k, v in target.items():
        v.copy_(fresh[k])        # what Subscriber.pull_into does
    assert all(v.data_ptr() == ptr[k] for k, v in b.model.state_dict().items())
    assert all(torch.equal(v, fresh[k]) for k, v in b.model.state_dict().items())
