"""Actor-critic over gymnasium spaces; transformer KV-cache sampling vs full recompute; top-p."""

import gymnasium as gym
import pytest
import torch

from rlmesh.rl.models import ActorCritic, Transformer, TransformerConfig, generate, sequence_logprobs, top_p_filter


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    torch.manual_seed(0)


def test_discrete_actor_critic_logprobs_and_entropy_match_torch_distributions():
    env = gym.make("CartPole-v1")
    policy = ActorCritic(env.observation_space, env.action_space)
    obs = torch.randn(16, 4)
    actions, logp, values = policy.act(obs)
    assert actions.shape == (16,) and actions.dtype == torch.long and values.shape == (16,)
    logp2, entropy, _ = policy.evaluate(obs, actions)
    dist = torch.distributions.Categorical(logits=policy.actor(obs))
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(logp2, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    # initial policy is near uniform (small output gain)
    assert torch.allclose(dist.probs, torch.full_like(dist.probs, 0.5), atol=0.05)


def test_gaussian_actor_critic_matches_torch_normal_and_greedy_is_the_mean():
    env = gym.make("Pendulum-v1")
    policy = ActorCritic(env.observation_space, env.action_space)
    with torch.no_grad():
        policy.log_std.fill_(-0.5)
    obs = torch.randn(8, 3)
    actions, logp, _ = policy.act(obs)
    assert actions.shape == (8, 1)
    mean = policy.actor(obs)
    dist = torch.distributions.Normal(mean, policy.log_std.exp())
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(-1))
    _, entropy, _ = policy.evaluate(obs, actions)
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    greedy, _, _ = policy.act(obs, greedy=True)
    torch.testing.assert_close(greedy, mean.detach())


def test_actor_critic_rejects_unsupported_spaces_with_a_hint():
    with pytest.raises(TypeError, match="FlattenObservation"):
        ActorCritic(gym.spaces.Discrete(3), gym.spaces.Discrete(2))


def _model(**kw):
    return Transformer(TransformerConfig(vocab_size=20, max_seq_len=40, d_model=32, n_heads=4, **kw)).eval()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_kv_cache_logprobs_match_full_forward(temperature, top_p):
    model = _model()
    gen = generate(model, [[1, 5, 6], [7, 8], [9, 10, 11, 12]], n=3, max_new_tokens=8, temperature=temperature,
                   top_p=top_p, eos_id=2, generator=torch.Generator().manual_seed(1))
    assert gen.input_ids.shape[0] == 9 and gen.completion_logprobs.shape == gen.completion_ids.shape
    full = sequence_logprobs(model, gen.input_ids, gen.attention_mask, gen.prompt_len, temperature)
    torch.testing.assert_close(full * gen.completion_mask, gen.completion_logprobs, atol=1e-5, rtol=1e-5)
    # samples of a prompt are contiguous and share the (left-padded) prompt
    assert (gen.input_ids[3:6, :gen.prompt_len] == torch.tensor([0, 0, 7, 8])).all()


def test_left_padding_does_not_change_logits():
    model = _model()
    ids = torch.tensor([[3, 4, 5, 6]])
    padded = torch.tensor([[0, 0, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    torch.testing.assert_close(model(ids)[0], model(padded, mask)[0, 2:], atol=1e-5, rtol=1e-5)


def test_completions_stop_at_eos_and_are_masked_after_it():
    model = _model()  # near-uniform over 20 tokens: EOS (id 2) comes up in most of 64 rows of 12
    gen = generate(model, [[1, 3]], n=64, max_new_tokens=12, eos_id=2, generator=torch.Generator().manual_seed(0))
    ended = 0
    for row, mask in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist()):
        if 2 in row:
            k = row.index(2)
            assert mask[: k + 1] == [1] * (k + 1) and sum(mask[k + 1:]) == 0
            assert all(t == 0 for t in row[k + 1:])
            ended += 1
        else:
            assert all(mask)
    assert 0 < ended < 64
    assert gen.num_tokens == int(gen.completion_mask.sum())


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False, False]
    assert kept(0.7) == [False, True, False, True]
    assert kept(0.81) == [False, True, True, True]
    assert kept(1.0) == [True, True, True, True]
    assert kept(1e-6) == [False, True, False, False]  # the top token always survives


def test_top_p_sampling_never_leaves_the_nucleus():
    model = _model()
    gen = generate(model, [[1, 3, 4]], n=256, max_new_tokens=1, top_p=0.3, generator=torch.Generator().manual_seed(0))
    logits = model(torch.tensor([[1, 3, 4]]))[0, -1]
    allowed = torch.isfinite(top_p_filter(logits[None], 0.3))[0]
    assert allowed[gen.completion_ids[:, 0]].all()
    assert allowed.sum() < 20  # the filter really removed tokens


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="n_heads"):
        TransformerConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="temperature"):
        generate(_model(), [[1]], temperature=0.0)


def test_hf_folder_loads_and_samples_consistently(tmp_path):
    transformers = pytest.importorskip("transformers")
    from rlmesh.rl.models.hf import load_hf

    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    model, tokenizer = load_hf(tmp_path)
    assert tokenizer is None
    gen = generate(model, [[1, 2, 3], [4, 5]], n=2, max_new_tokens=5, generator=torch.Generator().manual_seed(0))
    full = sequence_logprobs(model, gen.input_ids, gen.attention_mask, gen.prompt_len)
    torch.testing.assert_close(full * gen.completion_mask, gen.completion_logprobs, atol=1e-5, rtol=1e-5)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(tmp_path / "missing")
