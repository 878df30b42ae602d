"""Convert a GGUF model file into an ordinary Hugging Face model folder (fp32 safetensors + tokenizer).

Why: transformers loads a GGUF file (dequantising it to fp32, tokenizer and chat template
included) but refuses to ``save_pretrained`` a model loaded that way ("quantized with gguf and is
not serializable"). Building the same architecture from the config without its quantization
settings, loading the state dict (every key must match) and saving gives a folder that
``AutoModelForCausalLM.from_pretrained`` and vLLM load like any other.

    python scripts/convert_gguf.py DIR FILE.gguf OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers


def convert(src_dir: Path, gguf_file: str, out: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_file, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {k for k in missing if k == "lm_head.weight" and config.tie_word_embeddings}
    if set(missing) - tied or unexpected:
        raise SystemExit(f"convert_gguf: the state dict does not match the architecture "
                         f"(missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)})")
    if tied:
        model.tie_weights()
    model.generation_config.eos_token_id = tok.eos_token_id
    if tok.pad_token is None:  # left padding needs a pad token; the EOS is what chat models use
        tok.pad_token = tok.eos_token
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    convert(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
