"""The vLLM backend on a real model folder (SmolLM2-135M-Instruct), run as a script by
``test_vllm_real_model.py`` inside the venv that has vLLM (see ``vllm_check.py`` for why a script).

1. Chat-rendered prompts (the folder's template, through ``HFTokenizer``) sample in vLLM, and the
   trainer's forward pass (``load_hf``, the same folder) agrees on every sampled token's log-prob.
2. Decoding is the generator's, not the engine's: ``finish_completions`` re-decodes vLLM's token ids
   with the model's tokenizer and cuts at stop strings, so the text a reward scores is the same
   function of the ids under either backend.
3. LoRA: the engine serves the folder with vLLM's LoRA support, takes a weight version that is the
   trainer's adapter tensors only, in place, and then completes as the trainer's adapted model does.
(A full-weight version on a tiny model is ``vllm_check.py``'s; one engine start here keeps this short.)
Prints one JSON line of measurements last; exits non-zero on any failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("RLMESH_TELEMETRY", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--tol", type=float, default=2e-3, help="largest allowed log-prob gap vs the trainer's model")
    args = ap.parse_args()

    import torch

    from rlmesh.rl.backends.base import Completion, SamplingParams
    from rlmesh.rl.backends.decode import finish_completions
    from rlmesh.rl.backends.vllm_backend import VLLMBackend
    from rlmesh.rl.batching import completions_to_generation
    from rlmesh.rl.models.hf import HFTokenizer, load_hf
    from rlmesh.rl.models.sampling import generate, sequence_logprobs

    failures: list[str] = []
    results: dict[str, object] = {}

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    tok = HFTokenizer(args.model_dir)
    questions = ["What is 12 plus 30?", "Name a primary colour.", "Ana has 5 apples and buys 3 more. How many?",
                 "Say hello."]
    prompts = [tok.render(q) for q in questions]
    from rlmesh.rl.config import LoRAConfig
    from rlmesh.rl.models.hf import adapter_state_dict, apply_lora

    trainer, _ = load_hf(args.model_dir)
    lora = LoRAConfig(r=8)
    t0 = time.perf_counter()
    backend = VLLMBackend(args.model_dir, dtype="float32", max_model_len=256, lora=lora)
    results["engine_start_s"] = round(time.perf_counter() - t0, 2)
    try:
        sampled = [c for g in backend.generate(prompts, SamplingParams(n=2, max_tokens=16, seed=3)) for c in g]
        gen = completions_to_generation(sampled, tok.pad_id)
        with torch.no_grad():
            lp = sequence_logprobs(trainer, gen.input_ids, gen.attention_mask, gen.prompt_len)
        gap = float(((lp - gen.completion_logprobs).abs() * gen.completion_mask).max())
        results["logprob_gap"] = gap
        check(gap < args.tol, f"vLLM's log-probs of chat-rendered prompts match the trainer's (max gap {gap:.2e})")

        engine_text = [c.text for c in sampled]
        finish_completions(sampled, tok, ["."])
        same = all(c.text == tok.decode(c.token_ids).split(".")[0] or "." not in tok.decode(c.token_ids)
                   for c in sampled)
        check(same, "completions are the model tokenizer's decoding of their ids, cut at the stop string")
        cut = [c for c in sampled if c.finish_reason == "stop"]
        check(all("." not in c.text for c in cut), f"{len(cut)} completions cut at '.' keep only the text before it")
        results["engine_text_differs"] = sum(a != b.text for a, b in zip(engine_text, sampled))
        twin = [Completion(c.prompt_ids, list(c.token_ids), list(c.logprobs)) for c in sampled]
        finish_completions(twin, tok, ["."])  # the same ids as the torch backend would hand over
        check([c.text for c in twin] == [c.text for c in sampled], "the same ids give the same text whatever the engine")

        adapted = apply_lora(trainer, lora)
        greedy = SamplingParams(n=1, max_tokens=8, top_p=1e-6)
        before = [g[0].token_ids for g in backend.generate(prompts, greedy)]
        gen_t = torch.Generator().manual_seed(11)
        adapters = adapter_state_dict(adapted)
        with torch.no_grad():  # trained adapters: B is no longer zero
            for k, v in adapters.items():
                if "lora_B" in k:
                    v.copy_(torch.randn(v.shape, generator=gen_t) * 0.05)
        want = generate(adapted, prompts, n=1, max_new_tokens=8, top_p=1e-6, eos_id=tok.eos_id, pad_id=tok.pad_id)
        want_ids = [row[: int(m.sum())] for row, m in zip(want.completion_ids.tolist(), want.completion_mask)]
        t0 = time.perf_counter()
        backend.load_weights(adapters)
        results.update(lora_load_s=round(time.perf_counter() - t0, 3),
                       lora_bytes=int(sum(t.numel() * t.element_size() for t in adapters.values())))
        after = [g[0].token_ids for g in backend.generate(prompts, greedy)]
        check(after != before, "a LoRA version changed the engine's greedy completions")
        agree = sum(a == w for a, w in zip(after, want_ids))
        results["lora_greedy_agree"] = agree
        check(agree >= len(prompts) - 1, f"with the adapters, vLLM completes as the adapted model ({agree}/{len(prompts)})")
    finally:
        backend.close()
    results["failures"] = len(failures)
    print(json.dumps(results), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
