"""What a task needs of a tokenizer (:class:`Tokenizer`), and the character tokenizer of the
built-in transformer.

The tokenizer belongs to the model: a task renders prompts and checks answers in text, and the
model's tokenizer turns them into ids (:class:`~rlmesh.rl.models.hf.HFTokenizer` for a Hugging Face
folder, with its chat template). Only the built-in transformer, which has no tokenizer of its own,
reads :class:`CharTokenizer`'s ids.

Why characters for the built-in model: synthetic tasks are defined over a handful of characters,
and one token per character keeps the verifiers and the model's job transparent (a wrong token is
a wrong digit).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """The tokenizer contract of the LLM recipes: generators render prompts and decode completions
    with it, the trainer pads with it, and both generation backends decode through it, so a reward
    means the same thing under each."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    def render(self, prompt: str, system: str | None = None) -> list[int]:
        """The ids the model reads for a user ``prompt`` (and optional ``system`` message): through
        the chat template where the tokenizer has one, ending where the assistant's answer starts."""

    def encode(self, text: str) -> list[int]:
        """Ids of plain ``text`` (no special tokens): an answer's, for a supervised warm start."""

    def decode(self, ids: list[int]) -> str:
        """Text of generated ``ids``, special tokens left out, up to the first EOS."""


class CharTokenizer:
    """Maps characters of ``alphabet`` to ids ``3..``; 0/1/2 are pad/bos/eos."""

    PAD, BOS, EOS = 0, 1, 2
    _SPECIAL = ("<pad>", "<bos>", "<eos>")

    def __init__(self, alphabet: str = "0123456789+-*=() ") -> None:
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"CharTokenizer: alphabet {alphabet!r} has repeated characters")
        self.alphabet = alphabet
        self._to_id = {c: i + len(self._SPECIAL) for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self._SPECIAL) + len(self.alphabet)

    @property
    def pad_id(self) -> int:
        return self.PAD

    @property
    def eos_id(self) -> int:
        return self.EOS

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``text``; raises on a character outside the alphabet (naming it)."""
        try:
            ids = [self._to_id[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"CharTokenizer: {exc.args[0]!r} is not in the alphabet {self.alphabet!r}") from None
        return ([self.BOS] if bos else []) + ids + ([self.EOS] if eos else [])

    def render(self, prompt: str, system: str | None = None) -> list[int]:
        """``<bos>`` then the prompt's characters: the built-in model has no chat template, so a
        ``system`` message is refused rather than silently dropped."""
        if system:
            raise ValueError("CharTokenizer: the built-in transformer has no chat template for a system prompt; "
                             "use a model folder (model.path) or leave task.system_prompt unset")
        return self.encode(prompt, bos=True)

    def decode(self, ids: list[int], stop_at_eos: bool = True) -> str:
        """Text of ``ids``, skipping special tokens; stops at the first EOS by default."""
        out = []
        for i in ids:
            if i == self.EOS and stop_at_eos:
                break
            if i >= len(self._SPECIAL):
                out.append(self.alphabet[i - len(self._SPECIAL)])
        return "".join(out)
