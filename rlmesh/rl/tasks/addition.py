"""Multi-digit addition, ``"123+45="`` -> ``"168"``: verifiable, tunable difficulty, CPU-sized.

The generator is seeded and split-aware: held-out prompts come from a disjoint hash
bucket, so "held-out reward" really is measured on problems never trained on.
"""

from __future__ import annotations

import random
import zlib

from rlmesh.rl.tasks.base import Problem, Split, TextTask
from rlmesh.rl.tasks.tokenizer import CharTokenizer
from rlmesh.rl.tasks.verifiers import digit_match, exact_match

__all__ = ["AdditionTask", "Problem"]


class AdditionTask(TextTask):
    """Sums of two integers with ``min_digits..max_digits`` digits each.

    Args:
        min_digits, max_digits: operand size range (inclusive).
        heldout_fraction: share of the problem space reserved for evaluation (by a stable
            hash of the operands, so train and eval never overlap whatever the seeds).
        reverse_answer: the answer is written least-significant digit first
            (``"123+45="`` -> ``"861"``). Each output digit then depends only on digits
            already seen plus a carry, which small transformers learn far faster than
            most-significant-first (Lee et al. 2023, "Teaching Arithmetic to Small
            Transformers"). The task stays exactly verifiable.

    Its tokenizer is a :class:`CharTokenizer` for the built-in transformer; with a model folder the
    recipe hands it the model's own (:meth:`~rlmesh.rl.tasks.base.TextTask.use_tokenizer`), and the
    prompt ``"12+34="`` goes through the model's chat template like any other text.
    """

    def __init__(self, min_digits: int = 1, max_digits: int = 3, heldout_fraction: float = 0.1,
                 reverse_answer: bool = False) -> None:
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"AdditionTask: need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"AdditionTask: heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.min_digits, self.max_digits = min_digits, max_digits
        self.heldout_fraction = heldout_fraction
        self.reverse_answer = reverse_answer
        self.tokenizer = CharTokenizer("0123456789+=")
        self.name = f"addition_{min_digits}-{max_digits}"

    @property
    def max_answer_len(self) -> int:
        """Characters in the longest answer, plus one for EOS: the generation budget."""
        return self.max_digits + 2

    @property
    def max_prompt_len(self) -> int:
        return 2 * self.max_digits + 3  # bos a + b =

    def _is_heldout(self, a: int, b: int) -> bool:
        return zlib.crc32(f"{a}+{b}".encode()) % 10_000 < self.heldout_fraction * 10_000

    def sample(self, n: int, rng: random.Random, split: str = "train") -> list[Problem]:
        """``n`` problems from the ``"train"`` or ``"heldout"`` split."""
        if split not in tuple(Split):
            raise ValueError(f"AdditionTask.sample: split must be 'train' or 'heldout', got {split!r}")
        out: list[Problem] = []
        while len(out) < n:
            da, db = (rng.randint(self.min_digits, self.max_digits) for _ in range(2))
            a = rng.randint(0 if da == 1 else 10 ** (da - 1), 10**da - 1)
            b = rng.randint(0 if db == 1 else 10 ** (db - 1), 10**db - 1)
            if self._is_heldout(a, b) == (split == "heldout"):
                answer = str(a + b)
                out.append(Problem(f"{a}+{b}=", answer[::-1] if self.reverse_answer else answer, source=self.name))
        return out

    def score(self, completion: str, problem: Problem, partial: bool = False) -> float:
        """The verifier: exact match of the decoded completion with the sum, or with
        ``partial=True`` the per-digit credit of :func:`digit_match` (for training only)."""
        return digit_match(completion, problem.answer) if partial else exact_match(completion, problem.answer)
