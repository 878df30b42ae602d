"""A tiny random-weight Llama checkpoint plus a locally built tokenizer, written with
``save_pretrained``: the local model folder the ``vllm`` backend (and ``load_hf``) is
tested and benchmarked on, since nothing can be downloaded from a model hub here.

Why these sizes: vLLM's CPU attention needs ``head_dim >= 64`` (it rejects 16), so the
model is 2 layers x hidden 128 (2 query heads of 64, one KV head so the grouped-query
path is exercised), a few hundred thousand parameters. The tokenizer is character level
over the addition task's alphabet and uses the same ids as
:class:`rlmesh.rl.tasks.CharTokenizer` (pad 0, bos 1, eos 2, then the characters), so
token ids from the task mean the same thing to the HF model, vLLM and rlmesh.

Run ``python -m rlmesh.rl.backends.tiny_llama OUT_DIR`` to write one by hand.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ALPHABET = "0123456789+="
SPECIAL = ("<pad>", "<bos>", "<eos>")


@dataclass(frozen=True)
class TinyLlamaConfig:
    """Shape of the test model; every field maps onto ``transformers.LlamaConfig``."""

    hidden_size: int = 128
    """Width; ``num_attention_heads * head_dim`` must equal it."""
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    """Fewer KV heads than query heads: exercises grouped-query attention and the q/k/v split."""
    head_dim: int = 64
    """vLLM-CPU rejects head_dim 16; 64 works on AVX2 and AVX-512."""
    intermediate_size: int = 256
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = False
    """Untied by default so the ``lm_head`` mapping is exercised; tied works too."""
    seed: int = 0
    """Seed of the random init: the same config gives the same weights."""


def build_tokenizer(alphabet: str = ALPHABET):  # -> transformers.PreTrainedTokenizerFast
    """A character-level fast tokenizer with CharTokenizer's ids (built locally with ``tokenizers``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # deferred: optional transformers/tokenizers (rlmesh[hf])
    from transformers import PreTrainedTokenizerFast  # deferred: optional transformers/tokenizers (rlmesh[hf])

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({c: i + len(SPECIAL) for i, c in enumerate(alphabet)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # "1+2=", not "1 + 2 ="
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def make_tiny_llama(out_dir: str | Path, config: TinyLlamaConfig | None = None) -> Path:
    """Write a random-weight ``LlamaForCausalLM`` and its tokenizer to ``out_dir``; returns the path.

    Skips the work when ``out_dir`` already holds a model made from the same config
    (a ``tiny_llama.json`` stamp), so tests and benchmarks can share one folder.
    """
    import torch  # deferred: torch is heavy; only building this model needs it
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # deferred: optional transformers/tokenizers (rlmesh[hf])

    cfg = config or TinyLlamaConfig()
    out = Path(out_dir)
    stamp = out / "tiny_llama.json"
    if stamp.exists() and json.loads(stamp.read_text()) == asdict(cfg) and (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = len(SPECIAL) + len(ALPHABET)
    hf_cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(hf_cfg)
    # The default init (std 0.02) gives near-uniform next-token distributions; a larger one
    # makes greedy completions depend visibly on the weights, which the tests rely on.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3 if "embed" in name or "lm_head" in name else 0.08)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    stamp.write_text(json.dumps(asdict(cfg)))
    logger.info("tiny llama written to %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    make_tiny_llama(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama")
