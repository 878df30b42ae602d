"""The torch backend's prefix cache: a continued context samples exactly what a cold one does,
reads only its new tokens, and never survives a weight change."""

from __future__ import annotations

import torch

from rlmesh.rl.backends.base import SamplingParams
from rlmesh.rl.backends.torch_backend import TorchBackend
from rlmesh.rl.models.prefix_cache import PrefixCache, PrefixKV
from rlmesh.rl.models.transformer import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=32, max_seq_len=96, d_model=32, n_layers=2, n_heads=4)


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CFG)


def _turns(backend: TorchBackend, prompts: list[list[int]], observations: list[list[int]], turns: int = 3):
    """Multi-turn shape: each call's prompt is the last context + its completion + an observation."""
    contexts = [list(p) for p in prompts]
    out = []
    for t in range(turns):
        comps = backend.generate(contexts, SamplingParams(max_tokens=5, seed=100 + t))
        out.append([(c[0].token_ids, c[0].logprobs) for c in comps])
        # rows of different lengths, so the batch is left-padded differently from call to call
        contexts = [ctx + c[0].token_ids + observations[i][: 1 + (i + t) % len(observations[i])]
                    for i, (ctx, c) in enumerate(zip(contexts, comps))]
    return out


def test_continued_contexts_sample_the_same_tokens_and_logprobs_as_cold_ones():
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
    obs = [[11, 12, 13], [14], [15, 16]]
    warm = TorchBackend(_model(), pad_id=0, seed=0)
    cold = TorchBackend(_model(), pad_id=0, seed=0, prefix_cache_mb=0)
    a, b = _turns(warm, prompts, obs), _turns(cold, prompts, obs)
    for turn_a, turn_b in zip(a, b):
        for (ta, la), (tb, lb) in zip(turn_a, turn_b):
            assert ta == tb
            assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-5)
    # turns 2 and 3 read their earlier context from the cache: most prompt tokens were hits
    assert warm.prefixes.hits > warm.prefixes.misses
    assert cold.prefixes is None


def test_a_weight_change_empties_the_cache():
    model = _model()
    backend = TorchBackend(model, pad_id=0, seed=0)
    backend.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
    assert len(backend.prefixes) == 1
    new = {k: v + 0.01 for k, v in model.state_dict().items()}
    for k, v in backend.weight_target().items():  # what Subscriber.pull_into does: copy in place
        v.copy_(new[k])
    backend.prefixes.check_weights()
    assert backend.prefixes.take([1, 2, 3, 9, 9]) is None
    assert len(backend.prefixes) == 0


def test_lookup_takes_the_longest_true_prefix_and_evicts_by_bytes():
    model = _model()
    cache = PrefixCache(model, max_bytes=10_000)
    def entry(tokens: tuple[int, ...]) -> PrefixKV:  # one row of 4 heads x len x 8 dims: 128 bytes a token
        n = len(tokens)
        return PrefixKV(tokens, [torch.zeros(1, 4, n, 8)], [torch.zeros(1, 4, n, 8)], 0, list(range(n)))

    cache.put(entry((1, 2)))
    cache.put(entry((1, 2, 3, 4)))
    cache.put(entry((1, 9, 3)))
    got = cache.take([1, 2, 3, 4, 5])
    assert got is not None and got.tokens == (1, 2, 3, 4)
    assert cache.take([1, 2, 3, 4]) is not None and cache.take([1, 2, 3, 4]) is None  # (1,2) then nothing
    assert cache.take([1, 2]) is None  # a whole prompt is never a hit: one token must be read
    for i in range(40):  # 40 entries of 10 tokens = 51 kB > 10 kB: the oldest go
        cache.put(entry(tuple(range(100 + i, 110 + i))))
    assert len(cache) <= 10_000 // (10 * 128)
    assert cache.take(list(range(139, 149)) + [0]) is not None  # the newest stays


def test_a_batch_seeded_from_several_earlier_calls_samples_as_a_cold_one():
    """Cohorts (``max_batch``) meet again in one call: its rows' prefixes come from different earlier
    calls' caches, each gathered with its own indices."""
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11, 3]]
    results = []
    for backend in (TorchBackend(_model(), pad_id=0, seed=0), TorchBackend(_model(), pad_id=0, seed=0, prefix_cache_mb=0)):
        contexts = []
        for half in (prompts[:2], prompts[2:]):  # two calls, two caches
            comps = backend.generate(half, SamplingParams(max_tokens=4, seed=7))
            contexts += [p + c[0].token_ids + [12 + i] for i, (p, c) in enumerate(zip(half, comps))]
        comps = backend.generate(contexts, SamplingParams(max_tokens=4, seed=8))
        results.append([(c[0].token_ids, c[0].logprobs) for c in comps])
        if backend.prefixes is not None:  # the third call found each row's context from its earlier call
            assert backend.prefixes.hits == sum(len(c) - 2 for c in contexts)  # all but the last token and obs
    (warm, cold) = results
    for (ta, la), (tb, lb) in zip(warm, cold):
        assert ta == tb
        assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-5)


def test_seed_copies_runs_of_rows_as_blocks_and_gathers_rows_with_gaps():
    """Rows 0-1 continue consecutive rows of one earlier cache (a block), row 2 another cache's row,
    row 3 a row whose cached columns have a gap: each lands exactly where its prompt lies. Row 4 has
    nothing cached before ``start``. The cache is made unzeroed (here: all NaN), so every column of
    padding before ``start`` must come out zero: a masked NaN would still poison the attention."""
    from rlmesh.rl.models.prefix_cache import seed
    from rlmesh.rl.models.transformer import KVCache

    def filled() -> KVCache:
        c = KVCache(CFG, 3, 8, torch.float32)
        for t in (*c.keys, *c.values):
            t.copy_(torch.randn_like(t))
        return c

    a, b = filled(), filled()
    pa = [PrefixKV((1, 2, 3), a.keys, a.values, r, [2, 3, 4]) for r in (0, 1)]
    pb = PrefixKV((1, 2, 3), b.keys, b.values, 2, [5, 6, 7])
    gap = PrefixKV((1, 2, 3), b.keys, b.values, 0, [1, 3, 4])
    lengths, width, start = [5, 5, 4, 5, 2], 6, 4  # cached tokens before start: 3, 3, 2, 3, 0
    dst = KVCache(CFG, 5, 10, torch.float32)
    for t in (*dst.keys, *dst.values):
        t.fill_(float("nan"))
    seed(dst, [*pa, pb, gap, None], lengths, width, start)
    assert dst.length == start
    for layer in range(CFG.n_layers):
        for got, (src_a, src_b) in ((dst.keys[layer], (a.keys[layer], b.keys[layer])),
                                    (dst.values[layer], (a.values[layer], b.values[layer]))):
            assert torch.equal(got[0, :, 1:4], src_a[0, :, 2:5]) and torch.equal(got[1, :, 1:4], src_a[1, :, 2:5])
            assert torch.equal(got[2, :, 2:4], src_b[2, :, 5:7])
            assert torch.equal(got[3, :, 1:4], src_b[0][:, [1, 3, 4]])
            assert not got[:, :, 0].any() and not got[2, :, 1].any() and not got[4, :, :start].any()  # padding zeroed


def test_a_batch_that_continues_its_last_call_row_for_row_writes_on_in_the_same_cache():
    """No seeding at all when every row continues the same row of one earlier call: the new tokens go
    after the old columns of that call's cache (its tensors are reused, not copied), and sampling is
    still what a cold batch samples. A batch in another order cannot, and is seeded as before."""
    from rlmesh.rl.models import prefix_cache

    taken: list[bool] = []
    real = prefix_cache.continue_in_place

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        taken.append(out is not None)
        return out

    prefix_cache.continue_in_place = spy
    try:
        prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
        obs = [[11, 12, 13], [14], [15, 16]]
        warm = TorchBackend(_model(), pad_id=0, seed=0)
        cold = TorchBackend(_model(), pad_id=0, seed=0, prefix_cache_mb=0)
        keys_seen = []
        generate_one = warm.generate

        def recording(ps, p):
            out = generate_one(ps, p)
            keys_seen.append(next(iter(warm.prefixes._entries.values())).keys[0].data_ptr())
            return out

        warm.generate = recording
        a, b = _turns(warm, prompts, obs), _turns(cold, prompts, obs)
        assert taken[:3] == [False, True, True]  # the first call has nothing cached
        assert len(set(keys_seen)) == 1  # turns 2 and 3 wrote on in the first call's tensors
        for turn_a, turn_b in zip(a, b):
            for (ta, la), (tb, lb) in zip(turn_a, turn_b):
                assert ta == tb
                assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-5)
        # reversed rows: not the last call's layout, so seeded into a new cache; still the cold samples
        ctx = [p + o for p, o in zip(prompts, obs)]
        w2 = TorchBackend(_model(), pad_id=0, seed=0)
        first = w2.generate(ctx, SamplingParams(max_tokens=3, seed=5))
        nxt = [c + f[0].token_ids + [20] for c, f in zip(ctx, first)][::-1]
        taken.clear()
        got = w2.generate(nxt, SamplingParams(max_tokens=3, seed=6))
        assert taken == [False]
        cold2 = TorchBackend(_model(), pad_id=0, seed=0, prefix_cache_mb=0)
        want = cold2.generate(nxt, SamplingParams(max_tokens=3, seed=6))
        assert [g[0].token_ids for g in got] == [w[0].token_ids for w in want]
    finally:
        prefix_cache.continue_in_place = real


def _memory_held(cache: PrefixCache) -> int:
    """What the stored entries keep alive, counted from the tensors themselves: each distinct
    storage once (entries of one call share its cache)."""
    storages = {}
    for e in cache.entries():
        for t in (*e.keys, *e.values):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def test_the_bound_is_on_memory_held_not_on_rows():
    """A call's entries share its whole cache: a few surviving rows of each call must not keep every
    call's cache alive beyond the bound (GRPO's repeated samples grew a generator ~45 MB a step)."""
    cache = PrefixCache(_model(), max_bytes=200_000)
    for call in range(50):  # 50 calls of 64 rows, 4 heads x 8 tokens x 8 dims: 64 kB each (keys + values)
        keys, values = [torch.zeros(64, 4, 8, 8)], [torch.zeros(64, 4, 8, 8)]
        for r in range(2):  # only two distinct contexts a call, as when a group's samples agree
            cache.put(PrefixKV((call, r, 1, 2), keys, values, r, [0, 1, 2, 3]))
        assert _memory_held(cache) <= cache.max_bytes
        assert cache.held_bytes == _memory_held(cache)
    assert cache.take([49, 1, 1, 2, 5]) is not None  # the newest call's entries stay


def test_repeated_samples_of_many_calls_stay_within_the_bound():
    """The backend end to end: near-greedy groups (16 samples, a handful of distinct completions)
    over many calls hold at most ``prefix_cache_mb`` of caches."""
    backend = TorchBackend(_model(), pad_id=0, seed=0, prefix_cache_mb=1)
    for call in range(40):
        prompts = [[1 + (call + i) % 30, 2, 3] for i in range(8)]
        backend.generate(prompts, SamplingParams(n=16, max_tokens=4, top_p=1e-9))
        assert _memory_held(backend.prefixes) <= 1 << 20
