"""Rule-based verifiers: ``(completion, answer) -> reward in [0, 1]``.

These are the scoring functions ``RewardActor`` ships (``reward.kind=exact_match`` or
``numeric``). They are deliberately strict: a reward that can be gamed will be.
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
