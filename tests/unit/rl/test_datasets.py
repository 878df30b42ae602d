"""Prompt data sets from files (DuckDB reads JSONL, CSV, Parquet), the math verifier, and the
decoding every backend shares (stop strings cut tokens and text at the same place)."""

from __future__ import annotations

import json
import random

import pytest

from rlmesh.errors import ConfigError
from rlmesh.rl.backends.base import Completion
from rlmesh.rl.backends.decode import finish_completions, stop_cut
from rlmesh.rl.tasks import CharTokenizer, DatasetTask, Split, final_answer, math_match
from rlmesh.rl.tasks.dataset import resolve_data_path


def _rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} plus {i}?", "answer": f"It is {i} + {i} = {2 * i}.\n#### {2 * i}",
             "sys": f"system {i % 3}"} for i in range(n)]


def _write(path, rows, fmt: str) -> str:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import duckdb

        con = duckdb.connect()
        con.sql("CREATE TABLE t (question VARCHAR, answer VARCHAR, sys VARCHAR)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(r["question"], r["answer"], r["sys"]) for r in rows])
        con.sql(f"COPY t TO '{path}' (FORMAT {'csv, HEADER' if fmt == 'csv' else 'parquet'})")
        con.close()
    return str(path)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_every_format_reads_the_same_problems(tmp_path, fmt):
    path = _write(tmp_path / f"train.{fmt}", _rows(50), fmt)
    task = DatasetTask(path, "question", "answer", system_field="sys", answer_pattern=r"####\s*(.+)$",
                       template="{prompt}\nAnswer with a number.")
    everything = sorted(task.train + task.heldout, key=lambda p: p.prompt)
    assert len(everything) == 50
    p = next(p for p in everything if p.prompt.startswith("What is 7 plus 7?"))
    assert p.answer == "14" and p.system == "system 1" and p.source == f"train.{fmt}"
    assert p.prompt == "What is 7 plus 7?\nAnswer with a number."


def test_heldout_rows_are_never_trained_on_and_epochs_visit_every_row_once(tmp_path):
    task = DatasetTask(_write(tmp_path / "d.jsonl", _rows(200), "jsonl"), "question", "answer", heldout_fraction=0.2)
    train, held = {p.prompt for p in task.train}, {p.prompt for p in task.heldout}
    assert not train & held and len(train) + len(held) == 200 and 20 <= len(held) <= 60
    n = len(task.train)
    epoch = [p.prompt for i in range(n // 5 + 1) for p in task.batch(i, 5, seed=3)][:n]
    assert sorted(epoch) == sorted(train)  # each row once in epoch 0
    assert task.batch(2, 5, seed=3) == task.batch(2, 5, seed=3)  # a re-issued item: the same prompts
    assert [p.prompt for p in task.batch(0, n, seed=3)] != [p.prompt for p in task.batch(1, n, seed=3)]  # reshuffled
    assert len({p.prompt for p in task.sample(len(held), random.Random(0), Split.HELDOUT)}) == len(held)


def test_a_heldout_file_is_the_heldout_split(tmp_path):
    task = DatasetTask(_write(tmp_path / "a.jsonl", _rows(10), "jsonl"), "question", "answer",
                       heldout_path=_write(tmp_path / "b.jsonl", _rows(3), "jsonl"))
    assert len(task.train) == 10 and len(task.heldout) == 3 and task.heldout[0].source == "b.jsonl"


def test_bad_files_and_fields_name_the_setting_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="task.path.*does not exist"):
        DatasetTask(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="unknown format '.txt'"):
        DatasetTask(tmp_path / "x.txt")
    path = _write(tmp_path / "d.jsonl", _rows(5), "jsonl")
    with pytest.raises(ConfigError, match="no column 'prompt' \\(it has question, answer, sys\\).*task.prompt_field"):
        DatasetTask(path)


def test_the_shipped_sample_is_in_gsm8k_format():
    task = DatasetTask("pkg:gsm8k_sample.jsonl", "question", "answer", answer_pattern=r"####\s*(.+)$")
    assert resolve_data_path("pkg:gsm8k_sample.jsonl").is_file()
    rows = task.train + task.heldout
    assert len(rows) == 400 and all(p.answer.lstrip("-").isdigit() for p in rows)


def test_math_verifier_reads_the_final_answer_however_it_is_written():
    for text in ("So 3 + 4 = 7", "#### 7", "The answer is 7.", r"thus \boxed{7}", "#### 7.0"):
        assert math_match(text, "7") == 1.0, text
    assert math_match("#### 8", "7") == 0.0
    assert math_match("no idea", "7") == 0.0 and final_answer("no idea") is None
    assert math_match("They pay $1,200 in all", "1200") == 1.0
    assert math_match("#### 8", "7", format_reward=0.1) == 0.1


def test_stop_strings_cut_text_tokens_and_logprobs_alike():
    tok = CharTokenizer("0123456789+=#x ")
    ids = tok.encode("12+3=15##x9")
    assert stop_cut(ids, tok.decode, ["##"]) == (9, "12+3=15")  # the shortest prefix holding "##": 9 tokens
    assert stop_cut(ids, tok.decode, ["y"]) is None
    c = Completion([1], list(ids), [float(i) for i in range(len(ids))], loss_mask=[1] * len(ids))
    finish_completions([c], tok, ["##", "x"])
    assert (c.text, c.token_ids, c.finish_reason) == ("12+3=15", ids[:9], "stop")
    assert len(c.logprobs) == len(c.loss_mask) == 9
    d = Completion([1], tok.encode("12") + [tok.eos_id], [0.0, 0.0, 0.0], text="ignored: the engine's own text")
    finish_completions([d], tok, ["##"])
    assert d.text == "12" and d.finish_reason == "length"  # re-decoded by the task's tokenizer, nothing cut
