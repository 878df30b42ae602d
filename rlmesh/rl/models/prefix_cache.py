"""Keys and values of contexts the model already read, kept between generation calls.

Why: a multi-turn episode calls the model once per turn, each time on its whole context so far
(prompt, the model's earlier turns, the tools' answers). Without this cache every turn re-reads
that context from its first token; with it, a turn reads only what is new since the last call
(the last sampled token and the observation), as vLLM's prefix caching does on GPU.

When it is used: :class:`~rlmesh.rl.backends.torch_backend.TorchBackend` looks up each prompt's
longest cached prefix before sampling and stores every row's context after it. Only the built-in
:class:`~rlmesh.rl.models.transformer.Transformer` (its static :class:`KVCache`) takes part; other
models sample as before.

Correctness rests on two facts. Positions come from the attention mask's running count, so a
token's keys and values do not depend on how much left padding its row had: an entry computed in
one batch is valid in any other. And entries are only valid for the weights that computed them:
the cache remembers the parameters' in-place version counters and empties itself when any changed
(a weight pull, ``load_state_dict``, an optimiser step), so a new policy never reads old keys.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rlmesh.rl.models.transformer import KVCache

_MOD = (1 << 61) - 1  # rolling hash of token prefixes: h(p + [t]) = (h(p) * _BASE + t + 1) mod _MOD
_BASE = 1_000_003


def _prefix_hashes(tokens: Sequence[int]) -> list[int]:
    """``out[k]`` is the hash of ``tokens[:k]`` (``out[0]`` of the empty prefix)."""
    out = [0]
    h = 0
    for t in tokens:
        h = (h * _BASE + t + 1) % _MOD
        out.append(h)
    return out


@dataclass
class PrefixKV:
    """The keys and values of one context's first ``len(tokens)`` tokens: row ``row``, columns
    ``cols`` of a batch's cache (kept by reference: storing a batch's rows copies nothing)."""

    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    """Per layer, the batch's ``[B, H, L, head_dim]`` keys."""
    values: list[torch.Tensor]
    row: int
    cols: list[int]
    """The row's real columns, in order (left padding and masked tokens left out)."""
    nbytes: int = -1
    """What the entry holds alive: the whole batch's keys and values, not only its row's (the
    tensors are shared, so the memory goes only when every entry of the batch is gone)."""
    filled: int = 0
    """Columns the batch's cache had filled when the entry was made (its call's ``cache.length``)."""

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            self.nbytes = batch_nbytes(self.keys, self.values)


def batch_nbytes(keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
    """The bytes of one call's cache: what any entry pointing into it keeps alive."""
    return sum(t.numel() * t.element_size() for t in (*keys, *values))


class PrefixCache:
    """Least-recently-used store of :class:`PrefixKV`, bounded in bytes, emptied on a weight change.

    The bound is on memory held, not on rows: entries of one call share that call's cache, so a
    call's whole cache counts once while any of its entries is stored and is freed with its last.
    (Counting each entry as its row's share let a few surviving rows of each call pin every call's
    cache: GRPO's 2,048-row calls whose samples repeat grew a generator by ~45 MB a step.)

    Args:
        model: the model whose keys and values are stored (its parameters' versions are watched).
        max_bytes: what the entries may hold together; the least recently used go first.
    """

    def __init__(self, model: nn.Module, max_bytes: int = 256 << 20) -> None:
        self._params = list(model.parameters())
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, PrefixKV] = OrderedDict()
        self._batches: dict[int, list[int]] = {}
        """``id(entry.keys)`` -> [stored entries into that call's cache, its bytes]."""
        self._bytes = 0
        """Bytes of the calls' caches that stored entries keep alive, each counted once."""
        self._weights = self._weights_version()
        self.hits = 0
        """Prompt tokens found cached (a batch still re-reads a row's cached tokens that lie in the
        columns another row must read: every row starts at the widest unread column)."""
        self.misses = 0
        """Prompt tokens not found cached."""

    def _weights_version(self) -> int:
        return sum(p._version for p in self._params)

    def check_weights(self) -> None:
        """Empty the cache if any parameter changed in place since the last check (once per call)."""
        v = self._weights_version()
        if v != self._weights:
            self.clear()
            self._weights = v

    def clear(self) -> None:
        self._entries.clear()
        self._batches.clear()
        self._bytes = 0

    @property
    def held_bytes(self) -> int:
        """Memory the stored entries keep alive (every call's cache they point into, once)."""
        return self._bytes

    def _hold(self, e: PrefixKV) -> None:
        held = self._batches.get(id(e.keys))
        if held is None:
            self._batches[id(e.keys)] = [1, e.nbytes]
            self._bytes += e.nbytes
        else:
            held[0] += 1

    def _release(self, e: PrefixKV) -> None:
        held = self._batches[id(e.keys)]
        held[0] -= 1
        if held[0] == 0:
            del self._batches[id(e.keys)]
            self._bytes -= held[1]

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[PrefixKV]:
        """The stored entries, least recently used first."""
        return list(self._entries.values())

    def lookup(self, prompts: list[list[int]]) -> list[PrefixKV | None]:
        """:meth:`take` for each prompt of a call, after one :meth:`check_weights`; counts hits."""
        self.check_weights()
        found = [self.take(p) for p in prompts]
        hit = sum(len(f.tokens) for f in found if f is not None)
        self.hits += hit
        self.misses += sum(map(len, prompts)) - hit
        return found

    def store(self, cache: KVCache, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Keep every row of a finished call (:func:`extract`)."""
        for entry in extract(cache, input_ids, attention_mask):
            self.put(entry)

    def take(self, prompt: list[int]) -> PrefixKV | None:
        """The longest stored prefix of ``prompt`` shorter than it (one token must stay to be read),
        removed from the store: the caller stores the longer context it goes on to build.
        Call :meth:`check_weights` first (once per batch of lookups; :meth:`lookup` does)."""
        if not self._entries:
            return None
        hashes = _prefix_hashes(prompt)
        for k in range(len(prompt) - 1, 0, -1):
            e = self._entries.get(hashes[k])
            if e is not None and len(e.tokens) == k and list(e.tokens) == prompt[:k]:
                del self._entries[hashes[k]]
                self._release(e)
                return e
        return None

    def put(self, entry: PrefixKV) -> None:
        if not entry.tokens or entry.nbytes > self.max_bytes:
            return
        h = _prefix_hashes(entry.tokens)[-1]
        old = self._entries.pop(h, None)
        if old is not None:
            self._release(old)
        self._entries[h] = entry
        self._hold(entry)
        while self._bytes > self.max_bytes:
            _, gone = self._entries.popitem(last=False)
            self._release(gone)


def seed(cache: KVCache, prefixes: list[PrefixKV | None], lengths: list[int], width: int, start: int) -> None:
    """Fill columns ``[0, start)`` of a left-padded batch's cache from its rows' prefixes.

    Row ``r``'s prompt of ``lengths[r]`` tokens ends at column ``width``; what of it lies before
    ``start`` (its first ``lengths[r] - (width - start)`` tokens) must be in its prefix.

    Why block copies: a multi-turn call seeds every row of its batch, and a copy per row and layer
    (64 rows x 4 layers x keys and values: 512 indexed copies) cost more than the decode steps of
    the turn. Episodes that move in step (the usual case: same turn, same lengths) occupy
    consecutive rows and columns of an earlier call's cache, so such a run of rows is one slice
    copy per layer. Rows whose cached columns have gaps (a token masked mid-context) are gathered.
    """
    runs: list[list] = []  # [source PrefixKV, src row, src col, dst row, dst col, columns, rows]
    scattered: list[tuple[int, PrefixKV, list[int], int]] = []
    blank: list[list[int]] = []  # [dst row, rows, columns]: a row's padding before its cached columns
    for r, (p, n) in enumerate(zip(prefixes, lengths)):
        m = n - (width - start)
        pad = start if m <= 0 else width - n
        if pad:  # the cache is not zeroed when made: padding a forward never writes is zeroed here
            if blank and blank[-1][0] + blank[-1][1] == r and blank[-1][2] == pad:
                blank[-1][1] += 1
            else:
                blank.append([r, 1, pad])
        if m <= 0:
            continue
        assert p is not None and len(p.tokens) >= m, "a row's prefix must cover its columns before start"
        col = width - n
        c0 = p.cols[0]
        if p.cols[m - 1] - c0 != m - 1:  # a gap among its cached columns
            scattered.append((r, p, p.cols[:m], col))
            continue
        last = runs[-1] if runs else None
        if (last is not None and last[0].keys is p.keys and last[1] + last[6] == p.row and last[3] + last[6] == r
                and last[2] == c0 and last[4] == col and last[5] == m):
            last[6] += 1
        else:
            runs.append([p, p.row, c0, r, col, m, 1])
    for layer in range(len(cache.keys)):
        for dst, name in ((cache.keys[layer], "keys"), (cache.values[layer], "values")):
            for p, sr, sc, dr, dc, m, k in runs:
                dst[dr:dr + k, :, dc:dc + m] = getattr(p, name)[layer][sr:sr + k, :, sc:sc + m]
            for r, p, cols, col in scattered:
                dst[r, :, col:col + len(cols)] = getattr(p, name)[layer][p.row][:, torch.tensor(cols)]
            for r, k, pad in blank:
                dst[r:r + k, :, :pad] = 0
    cache.length = start


def extract(cache: KVCache, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[PrefixKV]:
    """Every row's real (unmasked) tokens among the cache's filled columns, as entries that point
    into the cache (which a later generation call never writes again: each call has its own)."""
    n = cache.length
    ids, mask = input_ids[:, :n].tolist(), attention_mask[:, :n].tolist()
    held = batch_nbytes(cache.keys, cache.values)
    out = []
    for r, (row_ids, row_mask) in enumerate(zip(ids, mask)):
        cols = [c for c, keep in enumerate(row_mask) if keep]
        out.append(PrefixKV(tuple(row_ids[c] for c in cols), cache.keys, cache.values, r, cols, held, n))
    return out


@dataclass
class Continuation:
    """A call that goes on writing the cache its rows' prefixes live in (:func:`continue_in_place`)."""

    cache: KVCache
    input_ids: torch.Tensor
    """``[B, width + max_new]``: each row's cached tokens at their columns, its unread suffix ending at ``width``."""
    attention_mask: torch.Tensor
    width: int
    start: int
    """The first column to read (the cache's filled length)."""


def continue_in_place(prompts: list[list[int]], prefixes: list[PrefixKV | None], max_new_tokens: int,
                      pad_id: int, max_seq_len: int) -> Continuation | None:
    """The cheapest seeding: none. When every row of a call continues the same row of one earlier
    call (a batch of episodes taking their next turn together, ``n`` = 1), that call's cache already
    holds every row's context at its columns, so the new tokens are written after them and no key or
    value is copied. Each row's unread suffix (the last sampled token, the observation) is right-aligned
    in the new columns, padding masked. ``None`` when the rows are not exactly that (another order,
    other calls, rows left out) or the cache has too few columns left: the caller seeds a new cache.

    Why: seeding copies every row's keys and values once a turn (4-7 ms a call at B = 64, d_model
    256, 4 layers, about 5-8 % of a 3-turn episode's generation), for a layout the cache already has.
    Safe because the prefixes were taken out of the store (:meth:`PrefixCache.take`): nothing else
    reads those rows, and the columns written here lie past every entry's ``cols``.
    """
    first = prefixes[0] if prefixes else None
    if first is None or first.filled <= 0 or len(prompts) != first.keys[0].shape[0]:
        return None
    for r, p in enumerate(prefixes):
        if p is None or p.row != r or p.keys is not first.keys or p.filled != first.filled:
            return None
    start = first.filled
    suffix = [len(pr) - len(p.tokens) for pr, p in zip(prompts, prefixes)]  # type: ignore[union-attr]  # none is None: checked above
    width = start + max(suffix)
    if width + max_new_tokens > min(first.keys[0].shape[2], max_seq_len):
        return None
    total = width + max_new_tokens
    ids_rows, mask_rows = [], []  # built as lists, one tensor each: per-row tensor ops cost ~4 ms at B = 64
    for pr, p, k in zip(prompts, prefixes, suffix):
        ids, mask = [pad_id] * total, [0] * total
        for c, tok in zip(p.cols, p.tokens):  # type: ignore[union-attr]  # none is None: checked above
            ids[c], mask[c] = tok, 1
        ids[width - k:width] = pr[len(p.tokens):]  # type: ignore[union-attr]  # none is None: checked above
        mask[width - k:width] = [1] * k
        ids_rows.append(ids)
        mask_rows.append(mask)
    device = first.keys[0].device
    input_ids = torch.tensor(ids_rows, dtype=torch.long, device=device)
    attention_mask = torch.tensor(mask_rows, dtype=torch.long, device=device)
    cache = KVCache.adopt(first.keys, first.values, start)
    return Continuation(cache, input_ids, attention_mask, width, start)
