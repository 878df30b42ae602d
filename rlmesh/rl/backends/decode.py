"""One decoding for every backend: the text a reward scores comes from the model's tokenizer,
cut at the first stop string, whatever engine sampled the tokens.

Why: vLLM decodes with its own detokenizer and stops on strings by itself, the torch sampler
returns ids; scored as each engine returned them, the same completion could earn different
rewards under the two. :func:`finish_completions` re-decodes every completion's ids with the
task's (the model's) tokenizer and applies ``generator.stop`` identically, trimming the token ids
and log-probs to the tokens that made the kept text, so the trainer trains on exactly what was
scored.
"""

from __future__ import annotations

from typing import Any, Sequence

from rlmesh.rl.backends.base import Completion


def stop_cut(ids: list[int], decode: Any, stops: Sequence[str]) -> tuple[int, str] | None:
    """``(k, text)`` for the first stop string in ``decode(ids)``: ``ids[:k]`` is the shortest prefix
    whose text contains it, ``text`` the decoded text before it. ``None`` when no stop string occurs.

    Decoding is monotone in the prefix (a longer prefix's text extends a shorter one's, for the
    byte-level and sentencepiece tokenizers of causal LMs), so ``k`` is found by bisection:
    about ``log2(len(ids))`` decodes a completion instead of one per token.
    """
    text = decode(ids)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return None
    at, stop = min(hits)
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if stop in decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo, text[:at]


def finish_completions(completions: Sequence[Completion], tokenizer: Any, stops: Sequence[str] = ()) -> None:
    """Decode each completion with ``tokenizer`` (in place) and cut it at the first of ``stops``."""
    for c in completions:
        cut = stop_cut(c.token_ids, tokenizer.decode, stops) if stops else None
        if cut is None:
            c.text = tokenizer.decode(c.token_ids)
            continue
        k, c.text = cut
        c.token_ids, c.logprobs = c.token_ids[:k], c.logprobs[:k]
        if c.loss_mask is not None:
            c.loss_mask = c.loss_mask[:k]
        c.finish_reason = "stop"
