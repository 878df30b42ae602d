"""Prompts and reference answers from a local file: JSONL, Parquet or CSV, read with DuckDB.

    task = DatasetTask("gsm8k_train.jsonl", prompt_field="question", answer_field="answer",
                       answer_pattern=r"####\\s*(.+)$")
    task.batch(index=0, n=8, seed=0)          # the first 8 prompts of epoch 0, in its shuffled order
    task.sample(100, random.Random(0), "heldout")

Why DuckDB: rlmesh already has it, and it reads all three formats (and globs of files) with
their types, so a data set needs no loader of its own and no ``datasets`` install.

Splits: a ``heldout_path`` file is the held-out set; without one, a stable hash of each prompt
puts ``heldout_fraction`` of the rows aside (the same rows whatever the seed, so evaluation never
sees a training prompt). Training walks the train rows in epochs, each in its own seeded order
(``shuffle``); a work item's prompts follow from its index alone, so a re-issued item gets the same
prompts again.
"""

from __future__ import annotations

import random
import re
import zlib
from pathlib import Path
from typing import Any

import duckdb

from rlmesh.errors import ConfigError
from rlmesh.rl.tasks.base import Problem, Split, TextTask

SHIPPED = Path(__file__).parent / "data"
"""Data files rlmesh ships (``pkg:<name>``): small samples written by the project."""


def resolve_data_path(path: str | Path) -> Path:
    """``pkg:<name>`` is a file rlmesh ships (:data:`SHIPPED`); anything else a local path (``~`` expanded)."""
    text = str(path)
    if text.startswith("pkg:"):
        return SHIPPED / text[4:]
    return Path(text).expanduser()


_READERS = {".jsonl": "read_json_auto", ".json": "read_json_auto", ".ndjson": "read_json_auto",
            ".parquet": "read_parquet", ".csv": "read_csv_auto", ".tsv": "read_csv_auto"}


def read_rows(path: str | Path, fields: list[str], what: str = "task.path") -> list[tuple[str, ...]]:
    """The ``fields`` of every row of ``path`` as strings (NULL stays ``None``), in file order.

    A missing file, an unknown format or a missing field is a :class:`ConfigError` naming the
    setting, what the file has, and the fix.
    """
    p = resolve_data_path(path)
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise ConfigError(f"{what}={str(path)!r}: unknown format {p.suffix!r}; use a .jsonl, .parquet or .csv file")
    if not p.exists():
        raise ConfigError(f"{what}={str(path)!r} does not exist; give the path of a local {p.suffix} file")
    con = duckdb.connect()
    try:
        rel = con.sql(f"SELECT * FROM {reader}('{_quote(str(p))}')")
        missing = [f for f in fields if f not in rel.columns]
        if missing:
            raise ConfigError(f"{what}={str(path)!r} has no column {missing[0]!r} (it has {', '.join(rel.columns)}); "
                              f"name the right one in task.prompt_field / task.answer_field / task.system_field")
        cols = ", ".join(f'CAST("{f}" AS VARCHAR)' for f in fields)
        return [tuple(r) for r in con.sql(f"SELECT {cols} FROM rel").fetchall()]
    finally:
        con.close()


def _quote(s: str) -> str:
    return s.replace("'", "''")


class DatasetTask(TextTask):
    """A prompt data set from a file, rendered through the model's chat template.

    Args:
        path: the training rows (``.jsonl``, ``.parquet`` or ``.csv``).
        prompt_field / answer_field: the columns holding the prompt and the reference answer.
        system_field: a column with a per-row system prompt (``None``: none, or ``system_prompt``).
        system_prompt: one system prompt for every row.
        template: how a row's prompt is written out (``{prompt}`` is the prompt field): instructions
            such as "give the final answer after ####".
        answer_pattern: a regular expression whose first group is the reference answer inside the
            answer field (GSM8K's ``####\\s*(.+)$``); ``None``: the whole field.
        heldout_path: held-out rows from their own file; else ``heldout_fraction`` of ``path``.
        shuffle: each epoch in its own seeded order (else file order).
        name: the ``rollouts.env`` name (default: the file's stem).
    """

    def __init__(self, path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer",
                 system_field: str | None = None, system_prompt: str | None = None, template: str = "{prompt}",
                 answer_pattern: str | None = None, heldout_path: str | Path | None = None,
                 heldout_fraction: float = 0.1, shuffle: bool = True, name: str | None = None) -> None:
        if "{prompt}" not in template:
            raise ConfigError(f"task.template={template!r} must contain {{prompt}} (where the row's prompt goes)")
        self.path, self.template, self.shuffle = str(path), template, shuffle
        self.pattern = re.compile(answer_pattern, re.MULTILINE | re.DOTALL) if answer_pattern else None
        self.name = name or resolve_data_path(path).stem
        self.tokenizer = None  # the model's: set by use_tokenizer before the task renders a prompt
        fields = [prompt_field, answer_field] + ([system_field] if system_field else [])
        rows = self._problems(path, fields, system_prompt, "task.path")
        if heldout_path:
            self.train, self.heldout = rows, self._problems(heldout_path, fields, system_prompt, "task.heldout_path")
        else:
            cut = heldout_fraction * 10_000
            self.train = [p for p in rows if zlib.crc32(p.prompt.encode()) % 10_000 >= cut]
            self.heldout = [p for p in rows if zlib.crc32(p.prompt.encode()) % 10_000 < cut]
        if not self.train:
            raise ConfigError(f"task.path={self.path!r} leaves no training rows (task.heldout_fraction="
                              f"{heldout_fraction}); add rows or lower task.heldout_fraction")

    def _problems(self, path: str | Path, fields: list[str], system_prompt: str | None, what: str) -> list[Problem]:
        out = []
        source = resolve_data_path(path).name
        for row in read_rows(path, fields, what):
            prompt, answer = row[0] or "", row[1] or ""
            if self.pattern is not None:
                m = self.pattern.search(answer)
                answer = m.group(1).strip() if m else answer
            system = row[2] if len(row) > 2 and row[2] else system_prompt
            out.append(Problem(self.template.replace("{prompt}", prompt), answer, system, source))
        if not out:
            raise ConfigError(f"{what}={str(path)!r} holds no rows")
        return out

    def rows(self, split: Split | str = Split.TRAIN) -> list[Problem]:
        return self.train if split == Split.TRAIN else self.heldout

    def batch(self, index: int, n: int, seed: int = 0) -> list[Problem]:
        """Work item ``index``'s ``n`` prompts: rows ``index * n ..`` of the epoch sequence, each epoch
        a seeded permutation of the train rows (so every row is seen once per epoch)."""
        rows, out = self.train, []
        for k in range(index * n, index * n + n):
            epoch, pos = divmod(k, len(rows))
            out.append(rows[self._order(epoch, seed)[pos]])
        return out

    def _order(self, epoch: int, seed: int) -> list[int]:
        cached: dict[tuple[int, int], list[int]] | None = getattr(self, "_orders", None)
        if cached is None:
            cached = {}
            self._orders = cached
        key = (epoch, seed)
        if key not in cached:
            order = list(range(len(self.train)))
            if self.shuffle:
                random.Random(seed * 1_000_003 + epoch).shuffle(order)
            if len(cached) > 4:
                cached.clear()
            cached[key] = order
        return cached[key]

    def sample(self, n: int, rng: random.Random, split: Split | str = Split.TRAIN) -> list[Problem]:
        """``n`` problems of ``split`` drawn by ``rng``: distinct while the split has that many
        (held-out evaluation takes the whole set at most once), with repeats only beyond that."""
        if split not in tuple(Split):
            raise ValueError(f"DatasetTask.sample: split must be 'train' or 'heldout', got {split!r}")
        rows = self.rows(split)
        if not rows:
            raise ConfigError(f"{self.path}: the held-out split is empty; set task.heldout_path or raise "
                              f"task.heldout_fraction")
        if n <= len(rows):
            return rng.sample(rows, n)
        return [rows[rng.randrange(len(rows))] for _ in range(n)]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_orders", None)
        return state
