"""The vLLM backend on a real model folder (SmolLM2-135M-Instruct), run as a script by
``test_vllm_real_model.py`` inside the venv that has vLLM (see ``vllm_check.py`` for why a script).

1. Chat-rendered prompts (the folder's template, through ``HFTokenizer``) sample in vLLM, and the
   trainer's forward pass (``load_hf``, the same folder) agrees on every sampled token's log-prob.
2. Decoding is the generator's, not the engine's: ``finish_completions`` re-decodes vLLM's token ids
   with the model's tokenizer and cuts at stop strings, so the text a reward scores is the same
   function of the ids under either backend.
3. A weight version published by the trainer reaches the running engine in place: its greedy
   completions become the trainer model's.
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
    from rlmesh.weights import Publisher, Subscriber

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
    trainer, _ = load_hf(args.model_dir)
    t0 = time.perf_counter()
    backend = VLLMBackend(args.model_dir, dtype="float32", max_model_len=256)
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

        greedy = SamplingParams(n=1, max_tokens=8, top_p=1e-6)
        before = [g[0].token_ids for g in backend.generate(prompts, greedy)]
        gen_t = torch.Generator().manual_seed(7)
        with torch.no_grad():  # the trainer changes its weights (a seeded perturbation stands in for training)
            for p in trainer.parameters():
                p.add_(torch.randn(p.shape, generator=gen_t) * 0.02)
        want = generate(trainer, prompts, n=1, max_new_tokens=8, top_p=1e-6, eos_id=tok.eos_id, pad_id=tok.pad_id)
        want_ids = [row[: int(m.sum())] for row, m in zip(want.completion_ids.tolist(), want.completion_mask)]
        name = f"vllm-real-{os.getpid()}"
        pub, sub = Publisher(name), Subscriber(name)
        try:
            t0 = time.perf_counter()
            pub.publish(trainer.state_dict(), version=1)
            sd, v = sub.pull(min_version=1, timeout=60)
            backend.load_weights(sd)
            results.update(weight_sync_s=round(time.perf_counter() - t0, 3), version=int(v),
                           bytes=int(sum(t.numel() * t.element_size() for t in sd.values())))
        finally:
            sub.close()
            pub.close()
        after = [g[0].token_ids for g in backend.generate(prompts, greedy)]
        check(after != before, "greedy completions changed after the in-place weight swap")
        agree = sum(a == w for a, w in zip(after, want_ids))
        results["greedy_agree"] = agree
        check(agree >= len(prompts) - 1, f"greedy completions equal the trainer model's ({agree}/{len(prompts)})")
    finally:
        backend.close()
    results["failures"] = len(failures)
    print(json.dumps(results), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
