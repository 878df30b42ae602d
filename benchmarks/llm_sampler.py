"""rlmesh's torch sampler against ``transformers`` ``generate`` on the same model folder, alone.

Why: in the side-by-side with TRL (``llm_vs_trl.py``) rlmesh's generation ran at a third of TRL's
tokens/s, but there it shared two busy cores with training and evaluation. This isolates the
sampler: the same prompts (chat-rendered), the same number of completions and new tokens, sampling
at temperature 1, one process, the same torch threads, the two interleaved round by round. It prints
tokens/s of each and the median and spread of the per-round ratios, and writes JSON.

    .venv/bin/python benchmarks/llm_sampler.py                      # SmolLM2-135M, 8 prompts x 4 x 48 tokens
    .venv/bin/python benchmarks/llm_sampler.py --model DIR --rounds 5 --threads 2
    .venv/bin/python benchmarks/llm_sampler.py --smoke              # a tiny random Llama, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import banner  # noqa: E402

from rlmesh.rl.backends.tiny_llama import make_tiny_llama  # noqa: E402
from rlmesh.rl.models.hf import load_hf  # noqa: E402
from rlmesh.rl.models.sampling import generate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (default: SmolLM2-135M-Instruct from scripts/setup_model.sh)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both")
    ap.add_argument("--smoke", action="store_true", help="a tiny random Llama, 2 rounds of 8 tokens")
    ap.add_argument("--json", default="llm_sampler.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        folder = make_tiny_llama(Path(tempfile.mkdtemp(prefix="rlmesh-sampler-")) / "tiny")
        args.rounds, args.max_new_tokens, args.prompts = 2, 8, 4
    else:
        folder = Path(args.model or subprocess.run(["bash", str(ROOT / "scripts" / "setup_model.sh")], check=True,
                                                   capture_output=True, text=True).stdout.strip().splitlines()[-1])
    banner("rlmesh torch sampler vs transformers generate", "torch", "transformers")
    print(f"# load at start: {os.getloadavg()[0]:.1f}; torch threads {args.threads}; model {folder}")
    model, tok = load_hf(folder)
    questions = [f"{i + 2}+{i + 5}=" if args.smoke  # the tiny model's tokenizer knows digits, + and = only
                 else f"Ana has {i + 2} apples and buys {i + 5} more. How many apples does she have?"
                 for i in range(args.prompts)]
    prompts = [tok.render(q) for q in questions]
    hf, ht = model.model, tok.hf
    ht.padding_side = "left"
    batch = ht([ht.decode(p) for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False)
    rows = []
    for r in range(args.rounds):
        g = torch.Generator().manual_seed(r)
        t0 = time.perf_counter()
        out = generate(model, prompts, n=args.samples, max_new_tokens=args.max_new_tokens, eos_id=tok.eos_id,
                       pad_id=tok.pad_id, generator=g)
        ours = (int(out.completion_mask.sum()), time.perf_counter() - t0)
        torch.manual_seed(r)
        t0 = time.perf_counter()
        with torch.no_grad():
            o = hf.generate(**batch, do_sample=True, num_return_sequences=args.samples, top_k=0, top_p=1.0,
                            max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_id)
        theirs_s = time.perf_counter() - t0
        new = o[:, batch["input_ids"].shape[1]:]
        theirs = (int((new != tok.pad_id).sum()), theirs_s)
        ratio = (ours[0] / ours[1]) / (theirs[0] / theirs[1])
        rows.append({"round": r, "rlmesh_tokens": ours[0], "rlmesh_s": ours[1], "transformers_tokens": theirs[0],
                     "transformers_s": theirs[1], "ratio": ratio})
        print(f"round {r}: rlmesh {ours[0] / ours[1]:.1f} tokens/s ({ours[0]} in {ours[1]:.2f} s), transformers "
              f"{theirs[0] / theirs[1]:.1f} tokens/s ({theirs[0]} in {theirs[1]:.2f} s): {ratio:.2f}x", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"tokens/s ratio rlmesh / transformers: median {statistics.median(ratios):.2f}x "
          f"(spread {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} interleaved rounds)")
    Path(args.json).write_text(json.dumps({"model": str(folder), "threads": args.threads, "rounds": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
