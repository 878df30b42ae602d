"""A character tokenizer: fixed alphabet plus ``<pad>``, ``<bos>``, ``<eos>``.

Why not a BPE: synthetic tasks are defined over a handful of characters, and one token
per character keeps the verifiers and the model's job transparent (a wrong token is a
wrong digit).
"""

from __future__ import annotations


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

    def decode(self, ids: list[int], stop_at_eos: bool = True) -> str:
        """Text of ``ids``, skipping special tokens; stops at the first EOS by default."""
        out = []
        for i in ids:
            if i == self.EOS and stop_at_eos:
                break
            if i >= len(self._SPECIAL):
                out.append(self.alphabet[i - len(self._SPECIAL)])
        return "".join(out)
