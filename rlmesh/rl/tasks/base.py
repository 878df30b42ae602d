"""What every LLM task hands the rest of the system: :class:`Problem` rows, split into train and
held-out, rendered to ids by the model's tokenizer.

A task renders prompts and checks answers in text; the tokenizer belongs to the model
(:class:`~rlmesh.rl.tasks.tokenizer.Tokenizer`). The recipe gives the task the model's tokenizer
(:meth:`TextTask.use_tokenizer`) before the task travels to the generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rlmesh.rl.tasks.tokenizer import Tokenizer


class Split(StrEnum):
    """Which problems: the ones trained on, or the held-out ones evaluation scores."""

    TRAIN = "train"
    HELDOUT = "heldout"


@dataclass(frozen=True)
class Problem:
    """One prompt and its reference answer."""

    prompt: str
    answer: str
    system: str | None = None
    """A system message for the chat template (``None``: the template's default, if any)."""
    source: str = ""
    """Where the problem came from (a data file's name, a generator's): recorded on every rollout row."""


class TextTask:
    """The part of a task that is the same for all: prompts to ids through the tokenizer in use.

    Subclasses set ``self.tokenizer`` (their default) and ``self.name``, and implement ``sample``.
    """

    tokenizer: Any
    name: str = "task"

    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Render prompts and decode completions with ``tokenizer`` (the model's) from now on."""
        self.tokenizer = tokenizer

    def encode_prompt(self, problem: Problem) -> list[int]:
        """The ids the model reads for ``problem``: its chat-rendered prompt."""
        return self.tokenizer.render(problem.prompt, problem.system)
