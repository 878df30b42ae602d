"""The worked example: multi-digit multiplication with a calculator tool.

A small transformer cannot multiply 2-3 digit numbers in its head within a CPU budget; with
the tool it only has to write the call and copy the result. One episode::

    prompt        "47*386="                      (the environment's first observation)
    model turn 1  "[47*386]"                     (stop token ']' = call the calculator)
    observation   "(18142)"                      (the tool's output; masked out of the loss)
    model turn 2  "18142<eos>"                   (the final answer: reward 1 if right)

A turn without ``[`` is the final answer. With ``tools=False`` the calculator is absent: a
call gets the error observation ``"(?)"``, so only answering in the head scores.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass
from typing import Any

from rlmesh.rl.agentic.protocol import StepResult, TextEnv
from rlmesh.rl.agentic.sft import sft_on_demonstrations
from rlmesh.rl.agentic.tools import Tool, ToolLimits
from rlmesh.rl.tasks.tokenizer import CharTokenizer

CALL_OPEN, CALL_CLOSE = "[", "]"
_CALL = re.compile(r"\[(\d{1,6})\*(\d{1,6})\]")


def calculate(args: str) -> str:
    """The calculator tool: ``"47*386"`` -> ``"18142"``; products of two integers only."""
    a, sep, b = args.partition("*")
    if not sep or not a.isdigit() or not b.isdigit() or len(a) > 6 or len(b) > 6:
        raise ValueError(f"calculator takes 'A*B' with integers of up to 6 digits, got {args!r}")
    return str(int(a) * int(b))


@dataclass(frozen=True)
class MulProblem:
    """One prompt and its answer (what ``EnvActor.reset`` receives as the task)."""

    prompt: str
    answer: str


class MultiplicationTask:
    """Products of ``min_digits..max_digits``-digit integers, with a held-out split by hash."""

    def __init__(self, min_digits: int = 2, max_digits: int = 3, heldout_fraction: float = 0.1,
                 sft_tool_fraction: float = 0.35) -> None:
        if not 1 <= min_digits <= max_digits <= 6:
            raise ValueError(f"MultiplicationTask: need 1 <= min_digits <= max_digits <= 6, got {min_digits}, {max_digits}")
        self.min_digits, self.max_digits, self.heldout_fraction = min_digits, max_digits, heldout_fraction
        self.sft_tool_fraction = sft_tool_fraction
        self.tokenizer = CharTokenizer("0123456789*=[]()?")
        self.name = f"multiplication_{min_digits}-{max_digits}"

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The tool-call stop token."""
        return tuple(self.tokenizer.encode(CALL_CLOSE))

    def max_episode_tokens(self) -> int:
        """Tokens after the prompt of a call, its result and the answer (with EOS)."""
        d = self.max_digits
        return (2 * d + 3) + (2 * d + 2) + (2 * d + 1)

    def max_prompt_len(self) -> int:
        return 2 * self.max_digits + 3  # bos a * b =

    def sample(self, n: int, rng: random.Random, split: str = "train") -> list[MulProblem]:
        if split not in ("train", "heldout"):
            raise ValueError(f"MultiplicationTask.sample: split must be 'train' or 'heldout', got {split!r}")
        out: list[MulProblem] = []
        while len(out) < n:
            a, b = (rng.randint(10 ** (d - 1), 10 ** d - 1)
                    for d in (rng.randint(self.min_digits, self.max_digits) for _ in range(2)))
            held = zlib.crc32(f"{a}*{b}".encode()) % 10_000 < self.heldout_fraction * 10_000
            if held == (split == "heldout"):
                out.append(MulProblem(f"{a}*{b}=", str(a * b)))
        return out

    def warm_start(self, model: Any, steps: int, lr: float, seed: int = 0) -> list[float]:
        """``GRPOTrainer``'s SFT warm start for this task: demonstrations, ``sft_tool_fraction`` with the tool."""
        return sft_on_demonstrations(model, self, steps, self.sft_tool_fraction, batch_size=32, lr=lr, seed=seed)

    def demonstration(self, p: MulProblem, use_tool: bool) -> list[tuple[str, bool]]:
        """A correct episode as ``(text, sampled_by_model)`` pieces after the prompt (the SFT warm start)."""
        if not use_tool:
            return [(p.answer, True)]
        return [(f"{CALL_OPEN}{p.prompt[:-1]}{CALL_CLOSE}", True), (f"({p.answer})", False), (p.answer, True)]


class CalculatorEnv(TextEnv):
    """Multiplication with a calculator. ``tools=False``: the same episodes with no calculator."""

    limits = ToolLimits(timeout_s=5.0)

    def __init__(self, tools: bool = True, isolate: bool = False) -> None:
        self.tools = {"calculator": Tool("calculator", calculate, isolate=isolate)} if tools else {}
        self.problem: MulProblem | None = None

    def reset(self, task: MulProblem) -> str:
        self.problem = task
        return task.prompt

    def step(self, model_text: str) -> StepResult:
        assert self.problem is not None, "step before reset"
        if CALL_OPEN in model_text:
            m = _CALL.search(model_text)
            args = m.group(0)[1:-1] if m else model_text
            result, call = self.call_tool("calculator", args)
            return StepResult(f"({result.output})" if result.error is None else "(?)", 0.0, False, call)
        return StepResult("", float(model_text.strip() == self.problem.answer), True)
