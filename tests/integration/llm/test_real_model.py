"""A real Hugging Face model end to end: SmolLM2-135M-Instruct with its tokenizer and chat template.

- the generator's sampler and the trainer's forward pass agree on every sampled token's log-prob;
- ``recipe=grpo_gsm8k`` takes a GRPO step through the whole mesh (real procs, the shipped data
  file, the math verifier), the new weights reach the generators in place, and the trained model
  comes out as a folder ``AutoModelForCausalLM.from_pretrained`` loads; with LoRA on a trainer mesh
  of two ranks (``trainer.ranks=2``) too;
- a task and a model that cannot agree are refused before any proc starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
import torch

from rlmesh.rl.backends.base import SamplingParams
from rlmesh.rl.backends.torch_backend import TorchBackend
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.models.hf import HFTokenizer, load_hf
from rlmesh.rl.models.sampling import sequence_logprobs

ROOT = Path(__file__).resolve().parents[3]
RUN = [sys.executable, "-m", "rlmesh.cli", "run"]
SMALL = ["steps=2", "generator.samples_per_prompt=4", "generator.max_new_tokens=24", "reward.format_reward=0.1",
         "eval.episodes=1", "eval.every=2", "telemetry.health_interval_s=0", "run.progress=false"]
"""What the recipe runs below share, sized for the suite: two steps (one may have no informative group),
one held-out prompt evaluated at versions 0 and 2 (the evaluator pulls the last version)."""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def gsm8k_run(model_dir: Path) -> list[str]:
    """One rank, full fine-tuning. No checkpoint_dir: the trainer's save at stop (1.6 GB of weights and
    Adam moments) is read by nothing here."""
    return [*RUN, "recipe=grpo_gsm8k", f"model.path={model_dir}", *SMALL, "prompts_per_step=2",
            "trainer.max_groups=1", "trainer.lr=1e-4", "trainer.checkpoint_dir="]


def lora_run(model_dir: Path) -> list[str]:
    """LoRA on two ranks, which train only whole pairs of informative groups a step: four prompts a step."""
    return [*RUN, "recipe=grpo_gsm8k", f"model.path={model_dir}", *SMALL, "prompts_per_step=4",
            "trainer.max_groups=2", "model.lora.r=8", "trainer.lr=1e-3", "trainer.kl_coef=0.01", "trainer.ranks=2"]


RUNS = {"test_grpo_gsm8k_steps_through_the_mesh_and_exports_a_transformers_folder": gsm8k_run,
        "test_lora_on_a_two_rank_trainer_mesh_trains_adapters_only_ships_only_them_and_exports": lora_run}


@dataclass
class Started:
    """A recipe run started by :func:`recipe_runs`, its output going to files in its folder."""

    proc: subprocess.Popen
    cwd: Path

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        code = self.proc.wait(timeout=timeout)
        out, err = ((self.cwd / name).read_text(errors="replace") for name in ("out.txt", "err.txt"))
        return subprocess.CompletedProcess(self.proc.args, code, out, err)


@pytest.fixture(scope="module", autouse=True)
def recipe_runs(request, model_dir, tmp_path_factory) -> Iterator[dict[str, Started]]:
    """The recipe runs of this module's selected tests, started together as the module starts (the
    other tests run meanwhile): a run spends much of its time waiting (a proc's imports, a batch, a
    weight version), so runs side by side end well before runs one after the other would. Each test
    waits for its own run and asserts on it alone."""
    selected = {item.originalname for item in request.session.items}
    runs: dict[str, Started] = {}
    try:
        for test, args in RUNS.items():
            if test in selected:
                cwd = tmp_path_factory.mktemp(test[5:30])
                with open(cwd / "out.txt", "w") as out, open(cwd / "err.txt", "w") as err:
                    runs[test] = Started(subprocess.Popen(args(model_dir), cwd=cwd, env=_env(), stdout=out,
                                                          stderr=err, text=True), cwd)
        yield runs
    finally:
        for run in runs.values():
            if run.proc.poll() is None:  # a test that failed before its run ended
                run.proc.terminate()
                try:
                    run.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    run.proc.kill()


@pytest.mark.timeout(300)
def test_chat_prompts_sample_and_the_trainer_agrees_on_logprobs(model_dir):
    torch.set_num_threads(2)
    tok = HFTokenizer(model_dir)
    ids = tok.render("What is 12 plus 30?", system="Answer briefly.")
    text = tok.hf.decode(ids)
    assert "<|im_start|>system\nAnswer briefly." in text and text.endswith("<|im_start|>assistant\n")
    backend = TorchBackend(model_path=str(model_dir), tokenizer=tok, seed=0)
    prompts = [ids, tok.render("Name a colour.")]  # different lengths: the batch is left-padded
    groups = backend.generate(prompts, SamplingParams(n=2, max_tokens=12, seed=3))
    rows = [c for g in groups for c in g]
    assert all(c.token_ids and len(c.logprobs) == len(c.token_ids) for c in rows)
    assert all(c.text == tok.decode(c.token_ids) for c in rows)
    trainer_model, _ = load_hf(model_dir)  # the trainer's own copy, one full forward pass
    gen = completions_to_generation(rows, tok.pad_id)
    with torch.no_grad():
        lp = sequence_logprobs(trainer_model, gen.input_ids, gen.attention_mask, gen.prompt_len)
    gap = ((lp - gen.completion_logprobs).abs() * gen.completion_mask).max().item()
    assert gap < 2e-3, f"sampler and trainer log-probs differ by {gap}"


@pytest.mark.timeout(900)
def test_grpo_gsm8k_steps_through_the_mesh_and_exports_a_transformers_folder(model_dir, recipe_runs):
    run = recipe_runs["test_grpo_gsm8k_steps_through_the_mesh_and_exports_a_transformers_folder"]
    r = run.wait(timeout=850)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    run_dir = next((run.cwd / "runs").glob("2*/telemetry.duckdb")).parent
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        steps = con.execute("SELECT step, json_extract_string(metrics, '$.\"train/groups\"') FROM train_steps").fetchall()
        rollouts = con.execute("SELECT DISTINCT source, finish_reason IS NOT NULL, prompt_tokens > 20 FROM rollouts "
                           "WHERE rollout_id LIKE 'group-%'").fetchall()
        samples = con.execute("SELECT count(*), count(DISTINCT policy_version) FROM samples").fetchone()
        pulled = con.execute("SELECT max(version) FROM weight_syncs WHERE ok AND mesh IN ('generator', 'evaluator')"
                         ).fetchone()[0]
    assert [s for s, _ in steps] == [1, 2]
    assert any(float(g or 0) > 0 for _, g in steps), "no informative group in two steps: nothing was trained"
    assert rollouts == [("gsm8k_sample.jsonl", True, True)]  # the data file's name, and chat-rendered prompts
    assert samples[0] > 0
    assert pulled == 2  # the trained weights reached the generators (pulled in place into their models)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exported = run_dir / "model"
    trained = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    original = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    assert AutoTokenizer.from_pretrained(exported, local_files_only=True).chat_template
    moved = max((a - b).abs().max().item() for a, b in zip(trained.parameters(), original.parameters()))
    assert moved > 0, "the exported model is the untrained one"


@pytest.mark.timeout(120)
def test_a_task_and_a_model_that_cannot_agree_are_refused_before_any_proc_starts(model_dir, tmp_path):
    r = _run([*RUN, "recipe=grpo_gsm8k"], tmp_path, timeout=110)
    assert r.returncode == 2 and "model.path" in r.stderr and "setup_model.sh" in r.stderr, r.stderr[-2000:]
    bare = tmp_path / "bare"  # a model folder without a tokenizer cannot read text prompts
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64}))
    r = _run([*RUN, "recipe=grpo_gsm8k", f"model.path={bare}"], tmp_path, timeout=110)
    assert r.returncode == 2 and "has no tokenizer" in r.stderr, r.stderr[-2000:]
    r = _run([*RUN, "recipe=grpo_gsm8k", f"model.path={model_dir}", "task.path=/no/such/file.jsonl"], tmp_path,
             timeout=110)
    assert r.returncode == 2 and "task.path" in r.stderr and "no such file" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("2*/telemetry.duckdb"))


@pytest.mark.timeout(900)
def test_lora_on_a_two_rank_trainer_mesh_trains_adapters_only_ships_only_them_and_exports(model_dir, recipe_runs):
    """``model.lora.r=8`` at ``trainer.ranks=2``: the recipe trains through an FSDP2 mesh of two gloo
    ranks, a weight version is the adapters (under 1 % of the model's bytes, in a part per rank), the KL
    reference is the base model itself, and the export gathers the adapters from the ranks into an ordinary
    folder with them merged."""
    run = recipe_runs["test_lora_on_a_two_rank_trainer_mesh_trains_adapters_only_ships_only_them_and_exports"]
    r = run.wait(timeout=850)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    run_dir = next((run.cwd / "runs").glob("2*/telemetry.duckdb")).parent
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        synced = con.execute("SELECT max(bytes), max(version) FROM weight_syncs WHERE ok").fetchone()
        kl, groups = con.execute("SELECT max(TRY_CAST(json_extract_string(metrics, '$.\"losses/kl\"') AS DOUBLE)), "
                                 "sum(TRY_CAST(json_extract_string(metrics, '$.\"train/groups\"') AS DOUBLE)) "
                                 "FROM train_steps").fetchone()
        ranks = con.execute("SELECT DISTINCT rank, ranks FROM train_ranks ORDER BY 1").fetchall()
    assert ranks == [(0, 2), (1, 2)]  # both ranks took every step
    assert groups and groups >= 2, "no pair of informative groups in two steps: nothing was trained"
    model_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    assert synced[1] == 2 and 0 < synced[0] < 0.01 * model_bytes, (synced, model_bytes)
    assert kl is not None and kl >= 0
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(run_dir / "model", local_files_only=True)
    original = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    assert set(dict(trained.named_parameters())) == set(dict(original.named_parameters()))  # merged: no lora_ names
    moved = {n for (n, a), (_, b) in zip(trained.named_parameters(), original.named_parameters()) if not torch.equal(a, b)}
    assert moved and all(any(t in n for t in ("q_proj", "k_proj", "v_proj", "o_proj")) for n in moved), sorted(moved)[:5]
