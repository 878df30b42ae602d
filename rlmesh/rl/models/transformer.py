"""A small decoder-only transformer (pre-LN, learned positions) with a static KV cache.

It is the ``torch`` backend of ``LLMGenerator`` on CPU: small enough to train with GRPO
in minutes, and it exposes the same two calls as the Hugging Face adapter
(:mod:`rlmesh.rl.models.hf`), so :mod:`rlmesh.rl.models.sampling` drives either:

- ``new_cache(batch, max_len)`` returns an empty cache;
- ``forward(input_ids, attention_mask, cache=None, last_only=False)`` returns logits for
  ``input_ids``, the new columns after whatever the cache already holds (``last_only``: the last
  column's alone, all a sampler reads after a prompt). ``attention_mask`` covers every column so
  far (cache + new), 1 for real tokens and 0 for left padding;
- ``repeat_cache(cache, n)`` returns a cache whose rows are each of ``cache``'s ``n`` times over
  (row ``i * n + j`` is row ``i``): a prompt is read once for its ``n`` samples.

Prompts are left-padded so every row's next token lands in the same column; positions
are counted over real tokens only, so a padded prompt sees the same positions as an
unpadded one (a test checks this).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rlmesh.rl.models.buffers import kv_buffers


@dataclass
class TransformerConfig:
    """Architecture of :class:`Transformer`."""

    vocab_size: int = 32
    """Number of token ids (the tokenizer's ``vocab_size``)."""
    max_seq_len: int = 64
    """Longest prompt + completion; sizes the position table and the KV cache."""
    d_model: int = 128
    """Residual stream width."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads; must divide ``d_model``."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of ``d_model``."""
    tie_embeddings: bool = True
    """Share the token embedding with the output projection."""

    def __post_init__(self) -> None:
        for key in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads", "mlp_ratio"):
            if getattr(self, key) < 1:
                raise ValueError(f"TransformerConfig.{key}={getattr(self, key)} must be >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "pick n_heads that divides d_model"
            )


class KVCache:
    """Preallocated keys and values, ``[B, H, max_len, head_dim]`` per layer, and the filled length.

    Its tensors come from :data:`~rlmesh.rl.models.buffers.kv_buffers` (on CPU, buffers a finished
    call no longer holds: fresh pages cost a fault each on first write). Not zeroed (a multi-turn
    step made ~25 MB of caches a call, and zeroing them was 4 % of its time): a forward writes
    every column before it attends to it, padding included, and
    :func:`~rlmesh.rl.models.prefix_cache.seed` zeroes the padding it does not fill. A column is
    never read unwritten, so the garbage an empty tensor holds (NaN bit patterns included, which a
    masked weight of 0 would not cancel) never reaches a softmax.
    """

    def __init__(self, config: TransformerConfig, batch: int, max_len: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        head_dim = config.d_model // config.n_heads
        # Columns rounded up (to 64, within max_seq_len): calls whose lengths differ a little share
        # buffer shapes, so the pool can hand one call's freed buffers to the next. Only the filled
        # columns are ever read.
        cols = max(max_len, min(-(-max_len // 64) * 64, config.max_seq_len))
        shape = (batch, config.n_heads, cols, head_dim)
        self.keys = [kv_buffers.empty(shape, dtype, device) for _ in range(config.n_layers)]
        self.values = [kv_buffers.empty(shape, dtype, device) for _ in range(config.n_layers)]
        self.length = 0
        self.max_len = max_len

    @classmethod
    def adopt(cls, keys: list[torch.Tensor], values: list[torch.Tensor], length: int) -> "KVCache":
        """A cache over an earlier call's tensors, ``length`` columns filled: a call that continues
        exactly that call's rows writes after them (:func:`~rlmesh.rl.models.prefix_cache.continue_in_place`)."""
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.length, cache.max_len = keys, values, length, keys[0].shape[2]
        return cache


class _Block(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.ln1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.mlp_ratio * config.d_model),
            nn.GELU(),
            nn.Linear(config.mlp_ratio * config.d_model, config.d_model),
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            start = cache.length
            cache.keys[layer][:, :, start:start + t] = k
            cache.values[layer][:, :, start:start + t] = v
            k = cache.keys[layer][:, :, :start + t]
            v = cache.values[layer][:, :, :start + t]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Decoder-only language model; see the module docstring for the calling convention."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init)
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache for ``batch`` rows of up to ``max_len`` (default ``max_seq_len``) columns."""
        max_len = max_len or self.config.max_seq_len
        if max_len > self.config.max_seq_len:
            raise ValueError(f"cache of {max_len} columns exceeds TransformerConfig.max_seq_len={self.config.max_seq_len}")
        param = self.tok_emb.weight
        return KVCache(self.config, batch, max_len, param.dtype, param.device)

    def repeat_cache(self, cache: KVCache, n: int) -> KVCache:
        """A cache of ``n`` copies of each of ``cache``'s rows (row ``i * n + j`` is row ``i``), its
        filled columns copied: the sampler reads a prompt once for all its samples."""
        rows = cache.keys[0].shape[0]
        out = self.new_cache(rows * n, cache.max_len)
        filled = cache.length
        for dst, src in zip(out.keys + out.values, cache.keys + cache.values):
            b, h, cols, d = dst.shape
            dst.view(rows, n, h, cols, d)[:, :, :, :filled] = src[:, None, :, :filled]
        out.length = filled
        return out

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache: KVCache | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for ``input_ids`` ``[B, T]`` (appended to ``cache`` if given);
        ``[B, 1, vocab]``, the last column's, with ``last_only``."""
        b, t = input_ids.shape
        start = cache.length if cache is not None else 0
        total = start + t
        if total > self.config.max_seq_len:
            raise ValueError(f"sequence of {total} tokens exceeds TransformerConfig.max_seq_len={self.config.max_seq_len}")
        if attention_mask is None:
            attention_mask = torch.ones(b, total, dtype=torch.long, device=input_ids.device)
        if attention_mask.shape != (b, total):
            raise ValueError(f"attention_mask must be [B, cached + new] = {(b, total)}, got {tuple(attention_mask.shape)}")
        positions = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, start:total]
        q_col = torch.arange(start, total, device=input_ids.device)
        k_col = torch.arange(total, device=input_ids.device)
        causal = k_col[None, :] <= q_col[:, None]
        # Every query may see itself, so rows of pure padding stay finite (they are never read).
        mask = (causal & attention_mask.bool()[:, None, None, :]) | (k_col[None, :] == q_col[:, None])
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache, i)
        if cache is not None:
            cache.length = total
        if last_only:
            x = x[:, -1:]
        return self.head(self.ln_f(x))
