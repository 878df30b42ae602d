"""Rule-based verifiers: ``(completion, answer) -> reward in [0, 1]``.

These are the scoring functions ``RewardActor`` ships (``reward.kind=exact_match``, ``numeric`` or
``math``). They are deliberately strict: a reward that can be gamed will be.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def exact_match(completion: str, answer: str, strip: bool = True) -> float:
    """1.0 iff the completion equals the answer (surrounding whitespace ignored by default)."""
    if strip:
        completion, answer = completion.strip(), answer.strip()
    return 1.0 if completion == answer else 0.0


def extract_number(text: str, position: str = "last") -> float | None:
    """The ``"first"`` or ``"last"`` number in ``text`` (int or decimal, optional minus), or None.

    Math-style completions often restate the question before the answer, so ``"last"`` is
    the default; a ``\\boxed{...}`` answer, if present, wins over either.
    """
    boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
    if boxed:
        text = boxed[-1]
    found = _NUMBER.findall(text.replace(",", ""))
    if not found:
        return None
    return float(found[-1] if position == "last" else found[0])


def numeric_match(completion: str, answer: str | float, tol: float = 1e-6, format_reward: float = 0.0) -> float:
    """1.0 if the number extracted from ``completion`` equals ``answer`` within ``tol``.

    ``format_reward`` is partial credit for producing *a* number that is wrong; 0 for no
    number at all. Keep it well below 1 or the policy learns to emit any number.
    """
    got = extract_number(completion)
    if got is None:
        return 0.0
    want = float(answer)
    return 1.0 if abs(got - want) <= tol * max(1.0, abs(want)) else format_reward


def digit_match(completion: str, answer: str) -> float:
    """Partial credit: the fraction of answer positions the completion gets right,
    over the longer of the two strings (so extra or missing characters cost credit).

    1.0 exactly when :func:`exact_match` is 1. A denser signal for training on
    arithmetic: a completion with one wrong digit is better than one with three. Evaluate
    with :func:`exact_match` regardless, so the metric cannot be satisfied by near misses.
    """
    completion, answer = completion.strip(), answer.strip()
    width = max(len(completion), len(answer))
    if width == 0:
        return 1.0
    return sum(a == b for a, b in zip(completion, answer)) / width


_FINAL = (re.compile(r"####\s*([^\n]+)"), re.compile(r"\\boxed\{([^}]*)\}"),
          re.compile(r"answer is[:\s]*\$?([^\n$]+)", re.IGNORECASE))


def final_answer(text: str) -> str | None:
    """The final answer a math completion states: after ``####`` (GSM8K's format), in
    ``\\boxed{}``, after "the answer is", else its last number; ``None`` when it states none."""
    for pattern in _FINAL:
        found = pattern.findall(text)
        if found:
            return found[-1].strip().rstrip(".")
    number = extract_number(text)
    return None if number is None else _NUMBER.findall(text.replace(",", ""))[-1]


def _as_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", "").replace("$", ""))
    return float(found[0]) if len(found) == 1 else None


def math_match(completion: str, answer: str, format_reward: float = 0.0) -> float:
    """1.0 when the completion's final answer (:func:`final_answer`) equals the reference.

    Numbers compare as numbers (``"1,200"``, ``"$1200"`` and ``"1200.0"`` agree); anything else
    (fractions, expressions, LaTeX) goes to ``math-verify``'s symbolic check where it is installed
    (the ``hf`` extra), else to an exact string match. ``format_reward`` is credit for stating an
    answer that is wrong.
    """
    got = final_answer(completion)
    if got is None:
        return 0.0
    a, b = _as_number(got), _as_number(answer)
    if a is not None and b is not None:
        return 1.0 if abs(a - b) <= 1e-6 * max(1.0, abs(b)) else format_reward
    return 1.0 if _symbolic_equal(got, answer) else format_reward


def _symbolic_equal(got: str, answer: str) -> bool:
    try:
        from math_verify import parse, verify  # deferred: optional (rlmesh[hf]); exact match without it
    except ImportError:
        return got.strip() == answer.strip()
    try:
        return bool(verify(parse(answer), parse(got)))
    except Exception:  # noqa: BLE001 - an unparsable answer is a wrong one
        return False
