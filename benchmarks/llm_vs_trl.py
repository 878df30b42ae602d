"""GRPO on a real Hugging Face model: rlmesh's ``grpo_gsm8k`` recipe against TRL's ``GRPOTrainer``,
side by side in one run, on the same CPU set.

Claim (issue 35, item 6): on the same model folder (SmolLM2-135M-Instruct), task, prompts and
hyperparameters, rlmesh reaches a held-out accuracy at least TRL's after the same number of steps,
in at most half TRL's seconds per step when both get the same cores.

Protocol, both sides from one composed recipe config (``recipe=grpo_gsm8k`` plus the overrides below),
so nothing is set twice by hand:

- **task and prompts**: the recipe's task (``configs/task/gsm8k.yaml``, the shipped GSM8K-format
  sample, prompts rendered through the model's chat template). Train step ``k`` of rlmesh trains work
  item ``k-1``, whose prompts are ``task.batch(k-1, prompts, seed * 1_000_003)``
  (:func:`rlmesh.recipes.loop.seeded_prompts`); TRL's data set is exactly those rows, step by step,
  with ``shuffle_dataset=False``, so both train the same prompts in the same order. TRL renders them
  through the same chat template (checked: the token ids are the ones rlmesh's task makes).
- **settings**: prompts per step, completions per prompt (``num_generations``), max new tokens
  (``max_completion_length``), learning rate, KL weight (``beta``), clip (``epsilon``), gradient
  clipping, micro-batch (``per_device_train_batch_size`` with gradient accumulation to one
  optimiser step per batch), constant learning rate, temperature 1.0, top-p, fp32, no gradient
  checkpointing, std-scaled group advantages (``scale_rewards="group"``), token-mean loss
  (``loss_type="dapo"``), one update per batch (``num_iterations=1``). A recipe setting with no
  TRL equivalent in this mapping stops the script.
- **reward**: :func:`rlmesh.rl.tasks.verifiers.math_match` with the recipe's ``reward.format_reward``,
  wrapped as a TRL reward function over the decoded completion.
- **held-out accuracy**: the same held-out problems (``task.sample(eval.episodes,
  Random(10_000 + seed), "heldout")``: with the default, the whole held-out split), greedy, the same
  max new tokens, scored by ``math_match``. rlmesh's come from its own ``evals`` table (its
  evaluator, versions 0 and ``steps``); TRL's model is evaluated in its process before and after
  training with ``transformers``' ``generate(do_sample=False)``.
- **CPUs and threads**: both sides run as subprocesses pinned to the same CPU set
  (``os.sched_setaffinity``, inherited by every proc rlmesh starts). TRL's process uses
  ``torch.set_num_threads(len(cpus))``; rlmesh's actor procs set one torch thread each (trainer,
  generator, evaluator, reward: ``rlmesh/rl/actors``), so rlmesh overlaps generation with training
  instead of using two threads for each in turn; its sampling (generator, evaluator) then takes as
  many threads as the set has CPUs that other processes leave free (``CpuShare``: one beside a
  training trainer, two while it waits, one on a host others load).
- **seconds per step**: from the start of the training loop (rlmesh: its first work item issued,
  with the procs up and the models loaded; TRL: ``on_train_begin``) to the end of the last step,
  over the steps; "steady" is the median interval between consecutive step ends. Start-up, model
  loading and TRL's two evaluations are outside it; rlmesh's version-0 evaluation runs inside it
  (concurrently with the first steps, as the recipe does it) and its duration is printed.
- **tokens/s**: "gen" is completion tokens per second of generating (rlmesh: its generator's
  ``generate`` spans; TRL: the time inside ``_generate_single_turn``); "total" is prompt plus
  completion tokens of the trained batches per second of the loop.
- **checkpoints**: TRL saves none (``save_strategy="no"``); rlmesh runs with
  ``trainer.checkpoint_every=0`` (it saves once, at the end, outside the loop's time) and
  ``model.export=false``. The recipe's default, a 1.6 GB checkpoint every step, is not what is timed.

Run (both sides, interleaved: ``--seeds 0 1`` runs rlmesh then TRL for seed 0, TRL then rlmesh for seed 1)::

    .venv/bin/python benchmarks/llm_vs_trl.py --steps 20 --prompts 8 --samples 4 --max-new-tokens 48 \\
        --rlmesh-lags 1 0 --heldout-fraction 0.25 --trl-threads 2 --cpus 0,1
    .venv/bin/python benchmarks/llm_vs_trl.py --smoke     # 2 steps, 2 prompts, 8 tokens: ~2 minutes

``--rlmesh-lags 1 0`` runs rlmesh with the recipe's one-step generation lag and strictly on-policy (as TRL);
``--heldout-fraction 0.25`` holds out 80 of the sample's 400 problems for both sides (the default 0.1: 30).
Each side's train reward per step (the completions it trained on) is printed by quarter of the run.

Measured on the 2-core machine, CPUs 0-1, 8 prompts x 4 x 48 tokens, TRL on 2 threads (docs/performance.md):
5 steps, quiet (load 0.2-5.1), seeds 0 / 1: rlmesh 12.8 / 10.7 s a step against TRL's 27.2 / 28.0: 0.47x /
0.38x, the target (0.5x) met. 20 steps, 80 held-out problems, seed 0, load 5-10: rlmesh 35.0 s a step (lag 1)
/ 33.0 (lag 0) against TRL's 88.6 (0.39x / 0.37x); held-out 0.113 -> 0.175 (lag 1) / 0.087 (lag 0) against TRL's 0.150;
train reward over the 20 steps 0.042 (lag 1) / 0.080 (lag 0) against TRL's 0.064: within one seed's noise.

TRL is a benchmark-only dependency (``pip install -e '.[bench]'``, or ``pip install trl``: it keeps
torch as installed). Without it the script still runs rlmesh's side and prints TRL's row as not
installed, with the reason. Everything printed also goes to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import versions  # noqa: E402

PACKAGES = ("rlmesh", "torch", "transformers", "trl", "accelerate", "datasets", "duckdb")
SMOKE = {"steps": 2, "prompts": 2, "samples": 4, "max_new_tokens": 8, "eval_episodes": 4}


# -- the shared configuration ------------------------------------------------------------------------------------

def overrides(a: dict) -> list[str]:
    """The recipe overrides both sides are built from (rlmesh runs them; TRL's side composes them)."""
    return ["recipe=grpo_gsm8k", f"model.path={a['model']}", f"steps={a['steps']}", f"prompts_per_step={a['prompts']}",
            f"generator.samples_per_prompt={a['samples']}", f"generator.max_new_tokens={a['max_new_tokens']}",
            "generator.temperature=1.0", f"trainer.lr={a['lr']}", f"trainer.kl_coef={a['kl']}",
            f"eval.every={a['steps']}", f"eval.episodes={a['eval_episodes']}", f"run.seed={a['seed']}",
            "trainer.checkpoint_every=0", "model.export=false", "run.progress=false",
            *([f"buffer.max_policy_lag={a['lag']}"] if a.get("lag") is not None else []),
            *([f"task.heldout_fraction={a['heldout_fraction']}"] if a.get("heldout_fraction") is not None else [])]


def compose_task(a: dict) -> tuple[Any, Any]:
    """The composed recipe config and its task, exactly as ``recipes/grpo.py`` builds them."""
    from rlmesh.recipes.compose import compose, load_program

    cfg, _ = compose(overrides(a))
    return cfg, load_program("grpo").make_task(cfg)


def trained_prompts(cfg: Any, task: Any) -> list[list[Any]]:
    """The prompts of each train step, in order: work item ``i`` of a fresh run (generation 0) is step ``i + 1``."""
    per_item = cfg.prompts_per_step // cfg.generator.replicas
    return [task.batch(i, per_item, cfg.run.seed * 1_000_003) for i in range(cfg.steps)]


def heldout_problems(cfg: Any, task: Any) -> list[Any]:
    """The held-out problems rlmesh's evaluator scores (``recipes/grpo.py``)."""
    return task.sample(cfg.eval.episodes, random.Random(10_000 + cfg.run.seed), "heldout")


# -- rlmesh's side -----------------------------------------------------------------------------------------------

def run_rlmesh(a: dict, cpus: list[int], timeout: float) -> dict:
    """``rlmesh run`` in a fresh directory, pinned to ``cpus``; its numbers come from its telemetry."""
    import duckdb

    with tempfile.TemporaryDirectory(prefix="llm-vs-trl-rlmesh-") as tmp:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR", "PYTHONDONTWRITEBYTECODE")}
        env["RLMESH_RUNS_DIR"] = os.path.join(tmp, "runs")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *overrides(a)], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=timeout, preexec_fn=_pin(cpus))
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"rlmesh run failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        (db,) = Path(tmp, "runs").glob("2*/telemetry.duckdb")
        summary = json.loads((db.parent / "result.json").read_text())
        with duckdb.connect(str(db), read_only=True) as con:
            q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
            start = q("SELECT min(epoch(ts)) FROM work_items WHERE event = 'issued'")[0][0]
            steps = q("SELECT step, epoch(ts), duration_s, metrics FROM train_steps ORDER BY step")
            consumed = [r[0] for r in q("SELECT work_id FROM work_items WHERE event = 'consumed'")]
            evals = q("SELECT policy_version, value, duration_s FROM evals WHERE metric = 'mean_reward' ORDER BY policy_version")
            gen_s, gen_calls = q("SELECT coalesce(sum(duration_s), 0), count(*) FROM spans "
                                 "WHERE mesh = 'generator' AND endpoint = 'generate'")[0]
            wait_s = q("SELECT coalesce(sum(duration_s), 0) FROM spans WHERE mesh = 'buffer' AND endpoint = 'sample'")[0][0]
            gen_tokens = q("SELECT coalesce(sum(length), 0) FROM rollouts WHERE rollout_id LIKE 'group-%'")[0][0]
            trained = q("SELECT coalesce(sum(length), 0), coalesce(sum(prompt_tokens), 0), count(*) FROM rollouts WHERE "
                        + " OR ".join(f"starts_with(rollout_id, '{w}/')" for w in consumed))[0] if consumed else (0, 0, 0)
            load = q("SELECT avg(load_1m), max(load_1m) FROM host_health")[0] if _has(con, "host_health", "load_1m") else (None, None)
            informative = [json.loads(m).get("train/informative_fraction", 0.0) for *_, m in steps]
            rewards = [json.loads(m).get("rollout/reward_mean") for *_, m in steps]
        ends = [t for _, t, _, _ in steps]
        loop_s = ends[-1] - start
        before = next((v for ver, v, _ in evals if ver == 0), None)
        after = next((v for ver, v, _ in evals if ver == a["steps"]), None)
        return {
            "side": "rlmesh", "steps": len(steps), "loop_s": loop_s, "s_per_step": loop_s / len(steps),
            "steady_s_per_step": _steady([start, *ends]), "step_ends_s": [e - start for e in ends],
            "gen_s": gen_s, "gen_calls": gen_calls, "gen_tokens": gen_tokens,
            # the generator's own count: tokens over seconds of sampling (its generate spans also hold weight pulls and scoring)
            "gen_tokens_per_s": summary.get("gen_tokens_per_s"), "gen_tokens_per_span_s": gen_tokens / max(gen_s, 1e-9),
            "train_s": sum(d for _, _, d, _ in steps), "train_wait_s": wait_s,  # a step's duration holds its wait for a batch
            "trained_completion_tokens": trained[0], "trained_prompt_tokens": trained[1], "trained_rows": trained[2],
            "total_tokens_per_s": (trained[0] + trained[1]) / loop_s, "informative_fraction": informative,
            "reward_mean": rewards,  # per train step: the mean reward of the 32 completions it trained on
            "heldout_before": before, "heldout_after": after,
            "eval_s": {str(ver): d for ver, _, d in evals}, "wall_s": wall,
            "threads": "1 torch thread per actor proc (trainer, generator, evaluator+buffer, reward: 4 procs + controller); "
                       "sampling follows the free CPUs",
            "torch_threads": {"trainer": 1, "generator": "1 to len(cpus)", "evaluator": "1 to len(cpus)", "reward": 1},
            "load_start": load0, "load_end": os.getloadavg()[0], "load_run_avg_max": load,
        }


def _has(con: Any, table: str, column: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
                            [table, column]).fetchone()[0])


# -- TRL's side (a child process: ``--child trl``) ---------------------------------------------------------------

def run_trl(a: dict, cpus: list[int], timeout: float) -> dict:
    """This script's ``--child trl`` mode in a subprocess pinned to ``cpus``; its last stdout line is the result."""
    with tempfile.TemporaryDirectory(prefix="llm-vs-trl-trl-") as tmp:
        spec = Path(tmp, "spec.json")
        spec.write_text(json.dumps({**a, "cpus": cpus, "out_dir": tmp}))
        env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", "trl", "--spec", str(spec)], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=timeout, preexec_fn=_pin(cpus))
        wall = time.perf_counter() - t0
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"TRL side failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return {**json.loads(lines[-1]), "wall_s": wall, "load_start": load0, "load_end": os.getloadavg()[0]}


def trl_child(spec_path: str) -> None:
    import torch

    a = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(a.get("trl_threads") or len(a["cpus"]))
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlmesh.rl.tasks.verifiers import math_match

    cfg, task = compose_task(a)
    tr, gen, rw = cfg.trainer, cfg.generator, cfg.reward
    _check_mapping(cfg)
    rows = [p for step in trained_prompts(cfg, task) for p in step]
    data = Dataset.from_list([{"prompt": _messages(p), "answer": p.answer} for p in rows])
    heldout = heldout_problems(cfg, task)
    hf_tok = AutoTokenizer.from_pretrained(a["model"])
    same_ids = all(list(hf_tok.apply_chat_template([_messages(p)], add_generation_prompt=True, tokenize=True,
                                                    return_dict=True)["input_ids"][0]) == task.encode_prompt(p)
                   for p in rows[:4] + heldout[:4])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=dtype)
    t = time.perf_counter()
    before = greedy_accuracy(model, task, heldout, gen.max_new_tokens, rw.format_reward)
    eval_before_s = time.perf_counter() - t

    def math_reward(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
        """rlmesh's ``reward.kind=math``: :func:`math_match` on the completion's text."""
        return [math_match(c[-1]["content"] if isinstance(c, list) else c, ans, format_reward=rw.format_reward)
                for c, ans in zip(completions, answer)]

    batch = cfg.prompts_per_step * gen.samples_per_prompt
    micro = tr.micro_batch_size or batch
    if batch % micro:
        micro = batch
    args = GRPOConfig(
        output_dir=str(Path(a["out_dir"], "trl")), max_steps=cfg.steps, seed=cfg.run.seed, use_cpu=True,
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        num_generations=gen.samples_per_prompt, max_completion_length=gen.max_new_tokens,
        temperature=gen.temperature, top_p=gen.top_p, top_k=0, learning_rate=tr.lr, beta=tr.kl_coef,
        epsilon=tr.clip_coef, epsilon_high=tr.clip_coef_high, max_grad_norm=tr.max_grad_norm,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, num_iterations=tr.update_epochs,
        loss_type="dapo", scale_rewards="group" if tr.normalize_std else "none", shuffle_dataset=False,
        bf16=cfg.model.dtype == "bfloat16", fp16=False, gradient_checkpointing=cfg.model.gradient_checkpointing,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        log_completions=False)
    trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=args, train_dataset=data, processing_class=hf_tok)
    timing = {"gen_s": 0.0, "gen_tokens": 0, "gen_calls": 0, "begin": None, "ends": []}
    generate = trainer._generate_single_turn

    def timed_generate(*args_: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = generate(*args_, **kwargs)
        timing["gen_s"] += time.perf_counter() - t
        timing["gen_calls"] += 1
        timing["gen_tokens"] += sum(len(ids) for ids in out[0])
        return out

    trainer._generate_single_turn = timed_generate

    class Clock(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            timing["begin"] = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            timing["ends"].append(time.perf_counter())

    trainer.add_callback(Clock())
    out = trainer.train()
    begin, ends = timing["begin"], timing["ends"]
    loop_s = ends[-1] - begin
    t = time.perf_counter()
    after = greedy_accuracy(trainer.model, task, heldout, gen.max_new_tokens, rw.format_reward)
    eval_after_s = time.perf_counter() - t
    history = [h for h in trainer.state.log_history if "loss" in h]
    total_tokens = int(trainer.state.num_input_tokens_seen)
    print(json.dumps({
        "side": "trl", "steps": len(ends), "loop_s": loop_s, "s_per_step": loop_s / len(ends),
        "steady_s_per_step": _steady([begin, *ends]), "step_ends_s": [e - begin for e in ends],
        "train_runtime_s": out.metrics.get("train_runtime"),
        "gen_s": timing["gen_s"], "gen_calls": timing["gen_calls"], "gen_tokens": timing["gen_tokens"],
        "gen_tokens_per_s": timing["gen_tokens"] / max(timing["gen_s"], 1e-9), "train_s": loop_s - timing["gen_s"],
        "trained_tokens": total_tokens, "total_tokens_per_s": total_tokens / loop_s,
        "reward_mean": [h.get("reward") for h in history],
        "heldout_before": before, "heldout_after": after, "eval_s": {"0": eval_before_s, str(cfg.steps): eval_after_s},
        "threads": f"1 proc, {torch.get_num_threads()} torch threads ({torch.get_num_interop_threads()} inter-op)",
        "torch_threads": {"trl": torch.get_num_threads()}, "affinity": sorted(os.sched_getaffinity(0)),
        "prompt_ids_match_rlmesh": same_ids,
        "trl_settings": {"per_device_train_batch_size": micro, "gradient_accumulation_steps": batch // micro,
                         "generation_batch_size": args.generation_batch_size, "loss_type": args.loss_type,
                         "scale_rewards": args.scale_rewards, "beta": args.beta, "epsilon": args.epsilon},
    }), flush=True)


def _messages(problem: Any) -> list[dict]:
    """A problem as chat messages: what ``HFTokenizer.render`` hands the chat template."""
    return ([{"role": "system", "content": problem.system}] if problem.system else []) + \
        [{"role": "user", "content": problem.prompt}]


def _check_mapping(cfg: Any) -> None:
    """Stop where the recipe uses a setting this script cannot give TRL as well."""
    tr, g = cfg.trainer, cfg.generator
    problems = [name for name, bad in [
        ("trainer.aggregation (TRL's loss_type='dapo' is token_mean)", tr.aggregation != "token_mean"),
        ("trainer.lr_schedule (constant here)", tr.lr_schedule != "constant" or tr.warmup_steps),
        ("trainer.sft_steps (TRL has no warm start)", tr.sft_steps),
        ("trainer.max_groups", tr.max_groups is not None), ("generator.replicas", g.replicas != 1),
        ("model.lora.r", cfg.model.lora.r), ("trainer.ranks", tr.ranks != 1)] if bad]
    if problems:
        raise SystemExit(f"llm_vs_trl: no TRL equivalent mapped for {', '.join(problems)}")


def greedy_accuracy(model: Any, task: Any, problems: list[Any], max_new_tokens: int, format_reward: float,
                    batch: int = 16) -> float:
    """Mean :func:`math_match` of greedy completions (``transformers``' ``generate``, left-padded
    batches of the task's chat-rendered prompt ids), decoded as rlmesh decodes them."""
    import torch

    from rlmesh.rl.tasks.verifiers import math_match

    tok = task.tokenizer
    was_training = model.training
    model.eval()
    scores = []
    with torch.no_grad():
        for i in range(0, len(problems), batch):
            chunk = problems[i:i + batch]
            ids = [task.encode_prompt(p) for p in chunk]
            width = max(map(len, ids))
            input_ids = torch.tensor([[tok.pad_id] * (width - len(x)) + x for x in ids])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, top_p=None, top_k=None, temperature=None)
            for p, row in zip(chunk, out[:, width:].tolist()):
                scores.append(math_match(tok.decode(row), p.answer, format_reward=format_reward))
    model.train(was_training)
    return sum(scores) / len(scores)


# -- running and reporting ---------------------------------------------------------------------------------------

def _pin(cpus: list[int]):
    return lambda: os.sched_setaffinity(0, cpus)


def _steady(times: list[float]) -> float | None:
    """Median interval between consecutive step ends (``times`` starts with the loop's start)."""
    gaps = [b - a for a, b in zip(times[1:], times[2:])]
    return statistics.median(gaps) if gaps else None


def trl_missing() -> str | None:
    """Why TRL's side cannot run here, or ``None``."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return "trl is not installed: it is a benchmark-only dependency (pip install -e '.[bench]' or pip install trl)"
    return None


def model_folder(given: str | None) -> str:
    if given:
        return given
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_model.sh")], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"scripts/setup_model.sh failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def fmt(x: Any, spec: str) -> str:
    if x is None:
        width = "".join(c for c in spec.split(".")[0] if c.isdigit())
        return "—".rjust(int(width or 1))
    return format(x, spec)


def row(r: dict) -> str:
    acc = f"{fmt(r.get('heldout_before'), '.3f')} -> {fmt(r.get('heldout_after'), '.3f')}"
    return (f"{r['label']:11s} seed {r['seed']}  {fmt(r['s_per_step'], '7.1f')}  {fmt(r['steady_s_per_step'], '7.1f')}  "
            f"{fmt(r['gen_tokens_per_s'], '8.1f')}  {fmt(r['total_tokens_per_s'], '8.1f')}  {acc:15s}  "
            f"{fmt(r['loop_s'], '6.0f')}  {fmt(r['wall_s'], '6.0f')}  {r['load_start']:4.1f}  {r['threads']}")


HEADER = (f"{'side':11s} {'seed':6s} {'s/step':>7s}  {'steady':>7s}  {'gen tok/s':>8s}  {'tok/s':>8s}  "
          f"{'held-out':15s}  {'loop s':>6s}  {'wall s':>6s}  load  threads")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder (default: scripts/setup_model.sh's SmolLM2-135M-Instruct)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--samples", type=int, default=4, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--kl", type=float, default=0.0, help="KL weight (rlmesh trainer.kl_coef, TRL beta)")
    p.add_argument("--eval-episodes", type=int, help="held-out problems (default: the whole held-out split, 30 "
                                                       "problems of the shipped sample at its heldout_fraction 0.1)")
    p.add_argument("--heldout-fraction", type=float,
                   help="task.heldout_fraction for both sides (more held-out problems, fewer train rows: 0.25 "
                        "holds out ~100 of the sample's 400)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="one round per seed; the order alternates")
    p.add_argument("--cpus", help="CPU set for both sides, e.g. 0,1 (default: this process's affinity)")
    p.add_argument("--trl-threads", type=int, nargs="+",
                   help="torch threads of TRL's process; several values run TRL once each and the ratios use "
                        "the fastest (default: one per CPU of the set)")
    p.add_argument("--rlmesh-lags", type=int, nargs="+",
                   help="run rlmesh once per buffer.max_policy_lag given (0: strictly on-policy, as TRL; 1: the "
                        "recipe's, generating the next batch while one trains), labelled rlmesh/lagN "
                        "(default: the recipe's, labelled rlmesh)")
    p.add_argument("--only", nargs="+", choices=["rlmesh", "trl"], default=["rlmesh", "trl"])
    p.add_argument("--smoke", action="store_true", help=f"a quick check of both sides: {SMOKE}")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per side")
    p.add_argument("--json", default=str(ROOT / "runs" / "llm_vs_trl.json"))
    p.add_argument("--child", choices=["trl"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "trl":
        trl_child(args.spec)
        return
    a = {"steps": args.steps, "prompts": args.prompts, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
         "eval_episodes": args.eval_episodes}
    if args.smoke:
        a.update(SMOKE)
    a.update(lr=args.lr, kl=args.kl, model=model_folder(args.model), heldout_fraction=args.heldout_fraction)
    if a["eval_episodes"] is None:  # the whole held-out split, each problem once
        a["eval_episodes"] = len(compose_task({**a, "eval_episodes": 1, "seed": 0})[1].rows("heldout"))
    cpus = sorted(int(c) for c in args.cpus.split(",")) if args.cpus else sorted(os.sched_getaffinity(0))
    missing = trl_missing() if "trl" in args.only else None
    machine = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus_total": os.cpu_count(),
               "cpus_used": cpus, "platform": platform.platform(), "python": platform.python_version(),
               "versions": versions(*PACKAGES), "load_start": os.getloadavg()}
    print(f"# GRPO on {Path(a['model']).name}: rlmesh recipe=grpo_gsm8k vs TRL GRPOTrainer")
    print(f"# machine: {machine['machine']}, {os.cpu_count()} CPUs, both sides pinned to CPUs {cpus}; "
          f"{machine['platform']}, python {machine['python']}")
    print(f"# versions: {machine['versions']}")
    print(f"# load at start: {' '.join(f'{x:.2f}' for x in machine['load_start'])}")
    print(f"# settings: {a['steps']} steps x {a['prompts']} prompts x {a['samples']} completions, "
          f"{a['max_new_tokens']} new tokens, lr {a['lr']}, KL {a['kl']}, temperature 1.0, "
          f"{a['eval_episodes']} held-out problems (greedy){' [smoke]' if args.smoke else ''}")
    print(f"# overrides: {' '.join(overrides({**a, 'seed': args.seeds[0]}))}")
    results: list[dict] = []
    sides: list[tuple[str, int | None]] = [("rlmesh", lag) for lag in (args.rlmesh_lags or [None])] \
        if "rlmesh" in args.only else []
    # --smoke: TRL on one thread unless told (two threads on a busy 2-core host ran 3.5x slower)
    sides += [("trl", n) for n in (args.trl_threads or [1 if args.smoke else len(cpus)])] if "trl" in args.only else []
    print("\n" + HEADER, flush=True)
    for k, seed in enumerate(args.seeds):
        for side, knob in sides if k % 2 == 0 else sides[::-1]:  # knob: rlmesh's lag, TRL's threads
            if side == "trl" and missing:
                results.append({"side": "trl", "label": "trl", "seed": seed, "skipped": missing})
                print(f"{'trl':11s} seed {seed}  not installed: {missing}", flush=True)
                continue
            label = (side if knob is None else f"rlmesh/lag{knob}") if side == "rlmesh" else f"trl/{knob}t"
            try:
                if side == "rlmesh":
                    r = run_rlmesh({**a, "seed": seed, "lag": knob}, cpus, args.timeout)
                else:
                    r = run_trl({**a, "seed": seed, "trl_threads": knob}, cpus, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the other side still runs; the exit code says it
                results.append({"side": side, "label": label, "seed": seed, "skipped": f"failed: {exc}"})
                print(f"{label:9s} seed {seed}  FAILED: {str(exc)[-1500:]}", flush=True)
                continue
            r = {**r, "seed": seed, "label": label}
            results.append(r)
            print(row(r), flush=True)
            _write(args.json, {"settings": a, "machine": machine, "results": results, "partial": True})
    summary = summarise(results)
    for line in summary["lines"]:
        print(line)
    out = {"settings": {**a, "seeds": args.seeds, "smoke": args.smoke}, "machine": machine, "results": results,
           "ratios": summary["ratios"], "load_end": os.getloadavg()}
    _write(args.json, out)
    print(f"# json: {args.json}")
    if any(str(r.get("skipped", "")).startswith("failed") for r in results):
        raise SystemExit(1)


def _write(path: str, data: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2))


def summarise(results: list[dict]) -> dict:
    """Ratios rlmesh / TRL per seed (same run), and the targets, against the strictest TRL variant:
    the fastest for time, the most accurate for accuracy; one set per rlmesh arm (``--rlmesh-lags``).
    Then each side's train reward per step: the mean reward of the 32 completions a step trained on,
    a learning curve with far more samples behind it than the held-out score."""
    lines = ["", "# ratios rlmesh / TRL, same seed, same run (targets: s/step <= 0.5x TRL's; held-out after >= TRL's)"]
    ratios: list[dict] = []
    by_seed: dict[int, list[dict]] = {}
    for r in results:
        by_seed.setdefault(r["seed"], []).append(r)
    for seed, rs in by_seed.items():
        meshes = [r for r in rs if r["side"] == "rlmesh" and "skipped" not in r]
        trls = [r for r in rs if r["side"] == "trl" and "skipped" not in r]
        if not meshes or not trls:
            ran = ", ".join(r["label"] for r in rs if "skipped" not in r) or "nothing"
            lines.append(f"seed {seed}: no ratio (only {ran} ran)")
            continue
        for m in meshes:
            lines.extend(_ratios(seed, m, trls, ratios))
    lines.extend(reward_curves(results))
    return {"lines": lines, "ratios": ratios}


def _ratios(seed: int, m: dict, trls: list[dict], ratios: list[dict]) -> list[str]:
    lines = []
    who = f"seed {seed}" if m["label"] == "rlmesh" else f"seed {seed} {m['label']}"
    for t in trls:
        rr = {"seed": seed, "side": m["label"], "baseline": t["label"], "s_per_step": m["s_per_step"] / t["s_per_step"],
              "steady_s_per_step": (m["steady_s_per_step"] / t["steady_s_per_step"]
                                    if m["steady_s_per_step"] and t["steady_s_per_step"] else None),
              "gen_tokens_per_s": (m["gen_tokens_per_s"] or 0) / t["gen_tokens_per_s"],
              "total_tokens_per_s": m["total_tokens_per_s"] / t["total_tokens_per_s"],
              "heldout_after_rlmesh": m["heldout_after"], "heldout_after_trl": t["heldout_after"]}
        ratios.append(rr)
        lines.append(f"{who} vs {t['label']}: s/step {rr['s_per_step']:.2f} (steady "
                     f"{fmt(rr['steady_s_per_step'], '.2f')}), gen tok/s {rr['gen_tokens_per_s']:.2f}, total tok/s "
                     f"{rr['total_tokens_per_s']:.2f}; held-out after {fmt(m['heldout_after'], '.3f')} vs "
                     f"{fmt(t['heldout_after'], '.3f')}")
    fast = min(trls, key=lambda t: t["s_per_step"])
    best = max(trls, key=lambda t: t["heldout_after"] if t["heldout_after"] is not None else -1)
    time_met = m["s_per_step"] <= 0.5 * fast["s_per_step"]
    acc_met = m["heldout_after"] is not None and best["heldout_after"] is not None and \
        m["heldout_after"] >= best["heldout_after"]
    ratios.append({"seed": seed, "side": m["label"], "targets": True, "time_baseline": fast["label"],
                   "time_target_met": time_met, "accuracy_baseline": best["label"], "accuracy_target_met": acc_met})
    lines.append(f"{who} targets: time {'met' if time_met else 'NOT met'} "
                 f"({m['s_per_step'] / fast['s_per_step']:.2f}x the fastest TRL, {fast['label']}), accuracy "
                 f"{'met' if acc_met else 'NOT met'} ({fmt(m['heldout_after'], '.3f')} vs "
                 f"{fmt(best['heldout_after'], '.3f')}, {best['label']})")
    lines.append(f"  where the time goes: {m['label']} generating {m['gen_s']:.0f} s ({m['gen_calls']} calls), training "
                 f"steps {m['train_s']:.0f} s (their buffer waits included; {m['train_wait_s']:.0f} s of buffer waits in "
                 f"all), version-0 eval {m['eval_s'].get('0', 0):.0f} s, inside a {m['loop_s']:.0f} s loop; informative "
                 f"fraction per step {' '.join(f'{x:.2f}' for x in m['informative_fraction'])}")
    for t in trls:
        lines.append(f"  {t['label']}: generating {t['gen_s']:.0f} s, training {t['train_s']:.0f} s of {t['loop_s']:.0f} s")
    return lines


def reward_curves(results: list[dict]) -> list[str]:
    """Each run's train reward per step in quarters of the run, and per side its mean over seeds."""
    lines = ["", "# train reward per step (mean of the completions each step trained on), by quarter of the run"]
    by_label: dict[str, list[list[float]]] = {}
    for r in results:
        curve = [x for x in r.get("reward_mean") or [] if x is not None]
        if "skipped" in r or not curve:
            continue
        by_label.setdefault(r["label"], []).append(curve)
        lines.append(f"{r['label']:11s} seed {r['seed']}: {_quarters(curve)}")
    for label, curves in by_label.items():
        width = min(map(len, curves))
        mean = [statistics.fmean(c[i] for c in curves) for i in range(width)]
        lines.append(f"{label:11s} mean of {len(curves)} seed(s): {_quarters(mean)}")
    return lines


def _quarters(curve: list[float]) -> str:
    q = max(1, len(curve) // 4)
    parts = [curve[i:i + q] for i in range(0, len(curve), q)]
    return (" | ".join(f"steps {i * q + 1}-{i * q + len(p)} {statistics.fmean(p):.3f}" for i, p in enumerate(parts))
            + f"; all {statistics.fmean(curve):.3f}")


if __name__ == "__main__":
    main()
