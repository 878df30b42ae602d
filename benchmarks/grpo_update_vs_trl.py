"""One GRPO update, rlmesh's against TRL's, on the same batch from the same weights.

Why: ``llm_vs_trl.py`` compares whole runs, where sampling, the held-out set's size and rlmesh's
one-step generation lag all add noise. This script removes them: it samples the batches once
(rlmesh's sampler, the ``grpo_gsm8k`` recipe's prompts of steps 1..K, its math reward), then
trains two copies of the same model folder on exactly those completions and rewards:

- **rlmesh**: :func:`rlmesh.rl.algorithms.grpo.grpo_update` with the recipe's trainer config (token-mean
  loss, micro-batches, clip, gradient clipping) and Adam, as ``GRPOTrainer`` calls it; old log-probs are
  the sampler's (on-policy here: the same weights sampled them).
- **TRL**: ``GRPOTrainer.compute_loss`` (``loss_type="dapo"``, ``scale_rewards="group"``,
  ``num_iterations=1``: TRL's old log-probs are its own detached ones) on each micro-batch, the inputs
  as its ``_generate_and_score_completions`` builds them (advantages by its formula, its EOS mask,
  ``num_items_in_batch`` = the completion tokens of the whole batch), then ``clip_grad_norm_`` and the
  optimiser ``GRPOTrainer.create_optimizer`` makes.

It prints, per step: both gradient norms before clipping, their ratio, the cosine of the whole
gradients and the lowest per-tensor cosine, the tokens each side normalises by, and after the optimiser
step the largest |delta param| difference against the largest |delta param|; after K steps, the cosine of
the two total parameter changes.

Run::

    .venv/bin/python benchmarks/grpo_update_vs_trl.py --steps 3 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Report, add_common_args, banner, have  # noqa: E402
from llm_vs_trl import compose_task, model_folder, trained_prompts  # noqa: E402


def sample_batches(cfg: Any, task: Any, model: Any, steps: int, seed: int) -> list[Any]:
    """The recipe's first ``steps`` batches, sampled once by rlmesh's sampler from the initial weights."""
    from rlmesh.rl.algorithms.grpo import ScoredBatch
    from rlmesh.rl.models.sampling import generate
    from rlmesh.rl.tasks.verifiers import math_match

    g, tok = cfg.generator, task.tokenizer
    out = []
    for k, problems in enumerate(trained_prompts(cfg, task)[:steps]):
        rng = torch.Generator().manual_seed(seed * 1000 + k)
        gen = generate(model, [task.encode_prompt(p) for p in problems], n=g.samples_per_prompt,
                       max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
                       eos_id=tok.eos_id, pad_id=tok.pad_id, generator=rng)
        texts = [tok.decode(row) for row in gen.completion_ids.tolist()]
        rewards = torch.tensor([math_match(t, problems[i // g.samples_per_prompt].answer,
                                           format_reward=cfg.reward.format_reward) for i, t in enumerate(texts)])
        out.append(ScoredBatch(problems, gen, rewards, texts))
    return out


def trl_inputs(batch: Any, eos_id: int, group_size: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The batch as TRL's ``_generate_and_score_completions`` hands it to ``compute_loss`` (whole batch)."""
    gen = batch.generation
    p = gen.prompt_len
    completion_ids = gen.input_ids[:, p:]
    # TRL: mask up to and including the first EOS
    is_eos = completion_ids == eos_id
    first = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    has = is_eos.any(1)
    first[has] = is_eos.int().argmax(1)[has]
    trl_mask = (torch.arange(is_eos.size(1))[None] <= first[:, None]).long()
    # TRL: (r - mean_g) / (std_g + 1e-4), std unbiased (nanstd), scale_rewards="group"
    grouped = batch.rewards.view(-1, group_size)
    std = grouped.std(dim=1).repeat_interleave(group_size)
    adv = (batch.rewards - grouped.mean(1).repeat_interleave(group_size)) / (std + 1e-4)
    inputs = {"prompt_ids": gen.input_ids[:, :p], "prompt_mask": gen.attention_mask[:, :p],
              "completion_ids": completion_ids, "completion_mask": trl_mask, "advantages": adv,
              "num_items_in_batch": trl_mask.sum()}
    checks = {"eos_mask_equal": bool(torch.equal(trl_mask, gen.completion_mask.long())),
              "tokens": int(trl_mask.sum())}
    return inputs, checks


def grads(model: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    return {prefix + n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine in float64: float32 sums over the 28M entries of the embedding drift by percents."""
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def compare(gr: dict[str, torch.Tensor], gt: dict[str, torch.Tensor]) -> dict[str, Any]:
    keys = [k for k in gr if k in gt]
    cos = {k: _cos(gr[k], gt[k]) for k in keys if gr[k].norm() > 0 and gt[k].norm() > 0}
    a = torch.cat([gr[k].double().flatten() for k in keys])
    b = torch.cat([gt[k].double().flatten() for k in keys])
    worst = min(cos, key=lambda k: cos[k])
    return {"tensors": len(keys), "cosine": _cos(a, b), "min_tensor_cosine": cos[worst], "min_tensor": worst,
            "norm_ratio": float(a.norm() / b.norm())}


def main() -> None:
    from rlmesh.rl.algorithms.grpo import grpo_update
    from rlmesh.rl.backends.torch_backend import build_policy_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--steps", type=int, default=1, help="batches, trained in order (the recipe's steps 1..K)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:  # one batch of 2 prompts x 2 x 8 tokens: checks that both updates run and compare
        args.steps, args.prompts, args.samples, args.max_new_tokens = 1, 2, 2, 8
    report = Report("same-batch GRPO update: rlmesh against TRL's GRPOTrainer", smoke=args.smoke, args=vars(args))
    banner(report.title, "torch", "transformers", "trl")
    if not have("trl"):
        report.skipped("TRL GRPOTrainer", "trl is not installed (pip install -e '.[bench]'); it is a benchmark-only "
                                          "dependency")
        report.write(args.json)
        return
    from datasets import Dataset  # TRL's: only where TRL is installed
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    a = {"model": model_folder(args.model), "steps": max(args.steps, 2), "prompts": args.prompts,
         "samples": args.samples, "max_new_tokens": args.max_new_tokens, "lr": args.lr, "kl": 0.0,
         "eval_episodes": 4, "seed": args.seed}
    cfg, task = compose_task(a)
    tr = cfg.trainer
    n = cfg.generator.samples_per_prompt
    print(f"# same-batch GRPO update: {Path(a['model']).name}, {args.steps} step(s) of {args.prompts} prompts x {n} x "
          f"{args.max_new_tokens} tokens, lr {args.lr}, seed {args.seed}, micro-batch {tr.micro_batch_size}, "
          f"max_grad_norm {tr.max_grad_norm}, aggregation {tr.aggregation}, load {os.getloadavg()[0]:.1f}")

    rl_model = build_policy_model(None, a["model"], "float32")[0]
    t = time.perf_counter()
    rl_model.eval()
    batches = sample_batches(cfg, task, rl_model, args.steps, args.seed)
    print(f"# sampled {args.steps} batch(es) in {time.perf_counter() - t:.0f} s")
    rl_model.train()
    rl_opt = torch.optim.Adam([p for p in rl_model.parameters() if p.requires_grad], lr=tr.lr)  # GRPOTrainer's

    hf_tok = AutoTokenizer.from_pretrained(a["model"])
    trl_model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.float32)
    batch_rows = args.prompts * n
    micro = tr.micro_batch_size or batch_rows
    targs = GRPOConfig(
        output_dir="/tmp/grpo-update-vs-trl", max_steps=args.steps, seed=args.seed, use_cpu=True,
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch_rows // micro, num_generations=n,
        max_completion_length=args.max_new_tokens, temperature=cfg.generator.temperature, learning_rate=tr.lr,
        beta=0.0, epsilon=tr.clip_coef, epsilon_high=tr.clip_coef_high, max_grad_norm=tr.max_grad_norm,
        lr_scheduler_type="constant", weight_decay=0.0, num_iterations=1, loss_type="dapo", scale_rewards="group",
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True)
    data = Dataset.from_list([{"prompt": "x", "answer": "0"}] * batch_rows)
    trainer = GRPOTrainer(model=trl_model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=targs,
                          train_dataset=data, processing_class=hf_tok)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = batch_rows // micro
    trl_opt = trainer.create_optimizer()
    decay = sorted({g["weight_decay"] for g in trl_opt.param_groups})
    print(f"# TRL optimiser: {type(trl_opt).__name__} lr {trl_opt.defaults.get('lr')}, weight decay of its groups {decay}"
          f"; rlmesh: Adam; eos {hf_tok.eos_token_id} / {task.tokenizer.eos_id}")

    start_r = {n_: p.detach().clone() for n_, p in rl_model.named_parameters()}
    start_t = {"model." + n_: p.detach().clone() for n_, p in trl_model.named_parameters()}
    rows = []
    for k, batch in enumerate(batches):
        inform = batch.rewards.view(-1, n).std(1) > 0
        # rlmesh
        before_r = {n_: p.detach().clone() for n_, p in rl_model.named_parameters()}
        m = grpo_update(rl_model, rl_opt, batch, tr, n, cfg.generator.temperature)
        norm_r = m.get("train/grad_norm", 0.0)
        clip = min(1.0, tr.max_grad_norm / (norm_r + 1e-6))
        g_r = {k_: v / clip for k_, v in grads(rl_model).items()} if norm_r else {}
        d_r = {n_: p.detach() - before_r[n_] for n_, p in rl_model.named_parameters()}
        # TRL
        inputs, checks = trl_inputs(batch, hf_tok.eos_token_id, n)
        before_t = {"model." + n_: p.detach().clone() for n_, p in trl_model.named_parameters()}
        trl_opt.zero_grad(set_to_none=True)
        for i in range(0, batch_rows, micro):
            mb = {k_: (v[i:i + micro] if v.dim() else v) for k_, v in inputs.items()}
            trainer.compute_loss(trainer.model, mb).backward()
        g_t = grads(trl_model, "model.")
        norm_t = float(torch.nn.utils.clip_grad_norm_(trl_model.parameters(), tr.max_grad_norm))
        trl_opt.step()
        d_t = {"model." + n_: p.detach() - before_t["model." + n_] for n_, p in trl_model.named_parameters()}
        c = compare(g_r, g_t) if g_r else {}
        dmax = max(float(v.abs().max()) for v in d_t.values())
        ddiff = max(float((d_r[k_] - d_t[k_]).abs().max()) for k_ in d_t)
        dcos = compare(d_r, d_t)["cosine"] if g_r else None
        rlmesh_tokens = float(m.get("train/normaliser_tokens", m.get("train/tokens", 0.0)))
        r = {"step": k + 1, "reward_mean": float(batch.rewards.mean()), "informative_groups": int(inform.sum()),
             "rlmesh_tokens": rlmesh_tokens, "trl_tokens": checks["tokens"], "eos_mask_equal": checks["eos_mask_equal"],
             "grad_norm_rlmesh": norm_r, "grad_norm_trl": norm_t, **c, "max_abs_dparam": dmax,
             "max_abs_dparam_diff": ddiff, "dparam_cosine": dcos, "rlmesh_clip_fraction": m.get("losses/clip_fraction"),
             "rlmesh_approx_kl": m.get("losses/approx_kl")}
        rows.append(r)
        print(f"step {k + 1}: reward {r['reward_mean']:.3f}, informative groups {r['informative_groups']}/{args.prompts}, "
              f"tokens rlmesh {rlmesh_tokens:.0f} / TRL {checks['tokens']} (EOS masks equal: {checks['eos_mask_equal']})")
        if not g_r:
            print("  no informative group: neither side has a gradient")
            continue
        print(f"  grad norm before clipping: rlmesh {norm_r:.4f}, TRL {norm_t:.4f}, ratio {c['norm_ratio']:.3f} "
              f"(tokens TRL/rlmesh {checks['tokens'] / max(rlmesh_tokens, 1):.3f}); clipped: rlmesh "
              f"{norm_r > tr.max_grad_norm}, TRL {norm_t > tr.max_grad_norm}")
        print(f"  gradient cosine {c['cosine']:.6f} over {c['tensors']} tensors, lowest per tensor {c['min_tensor_cosine']:.6f} "
              f"({c['min_tensor']}); rlmesh's ratio: approx_kl {r['rlmesh_approx_kl']:.2e}, clip fraction "
              f"{r['rlmesh_clip_fraction']:.4f}")
        print(f"  after the optimiser step: max |dparam| {dmax:.3e}, max |dparam difference| {ddiff:.3e}, "
              f"dparam cosine {dcos:.6f}")
    total_r = {n_: p.detach() - start_r[n_] for n_, p in rl_model.named_parameters()}
    total_t = {"model." + n_: p.detach() - start_t["model." + n_] for n_, p in trl_model.named_parameters()}
    tot = compare(total_r, total_t) if any(float(v.abs().max()) > 0 for v in total_t.values()) else {}
    if tot:
        print(f"# after {args.steps} step(s): total parameter change cosine {tot['cosine']:.6f} (lowest per tensor "
              f"{tot['min_tensor_cosine']:.6f}), norm ratio rlmesh/TRL {tot['norm_ratio']:.3f}")
    for r in rows:
        report.row(**r)
    compared = [r for r in rows if "norm_ratio" in r]
    if compared:
        report.ratio("gradient norm before clipping, rlmesh / TRL", [r["norm_ratio"] for r in compared],
                     "same batch, same weights; 1.0 is the same loss normalisation")
    else:
        report.skipped("gradient comparison", "no batch had an informative group (rewards all equal within "
                                              "each group): neither side has a gradient")
    report.write(args.json, extra={"total": tot})


if __name__ == "__main__":
    main()
