"""README.md and docs/*.md are guides in the present tense, not lab notebooks (docs/development.md).

A dated run log ("A fifth run, 3 Dec 2026 at load ~1", "Re-measured on 6 Dec 2026 (fourth session)")
belongs in git history. This fails on a line that puts a calendar date next to a word of a
measurement log, on a session narrative, and when docs/performance.md outgrows one current table
per benchmark.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PERFORMANCE_MAX_LINES = 220

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
# "6 Dec", "3-4 Dec", "Dec 6", "December 6th", "2026-12-06" (not a run id such as 20261202-101500-a1b2)
DATE = re.compile(rf"\b\d{{1,2}}(?:\s*[-–]\s*\d{{1,2}})?\s+{_MONTH}(?![a-z])|\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?\b(?!,?\s*\d{{3}})"
                  r"|\b20\d\d-[01]\d-[0-3]\d\b")
LOG_WORD = re.compile(r"\b(?:measured|re-measured|measurement|runs?|ran|session|sitting|load|timed|morning|"
                      r"afternoon|evening|night|today|yesterday|earlier|later|since|until|before|after|VM)\b",
                      re.IGNORECASE)
NARRATIVE = re.compile(r"\b(?:a|the)\s+(?:third|fourth|fifth|sixth|seventh|eighth)\s+run\b"
                       r"|\bthe day's (?:first|second|third|fourth|fifth|earlier|later)\b"
                       r"|\b(?:this|that|the|a) (?:first|second|third|fourth|fifth|earlier|later|previous) session\b"
                       r"|\bthis session\b|\bin the run before\b",
                       re.IGNORECASE)
NEAR = 80  # characters either side of a date in which a log word makes it a log line


def dated_log_lines(text: str) -> list[str]:
    """Lines that read as a dated run log: a date with a log word near it (across a line break too,
    as prose wraps), or a session narrative."""
    hits = [m.start() for m in DATE.finditer(text)
            if LOG_WORD.search(text[max(0, m.start() - NEAR):m.end() + NEAR])]
    hits += [m.start() for m in NARRATIVE.finditer(text)]
    lines = text.splitlines()
    return [lines[n].strip() for n in sorted({text.count("\n", 0, pos) for pos in hits})]


@pytest.mark.parametrize("line", [
    "A fifth run, 3 Dec 2026 at load ~1 (one run, `--n 2000`): raw pyzmq 158 µs",
    "## Results (2 shared CPU cores, load average 18-36 from other jobs, 2026-12-03)",
    "(The next paragraph was written on 3-4 Dec, before the figures above; its timings came from a",
    "Measured on Dec 6 at load 2",
    "Re-measured on 6 Dec 2026 (fourth session; the slow VM, load 1.1-1.3, 1 GiB shm, three runs of two",
    "**Small files, time to 8 ≤ 1.5× time to 1: met (1.47×; 1.45× in the run before)** once each",
])
def test_the_pattern_catches_dated_logs(line):
    assert dated_log_lines(line) == [line]


def test_a_date_and_its_log_words_on_two_lines_are_caught():
    text = ("1.10×; Ray 968 µs and Monarch 929 µs. Two more on 5 Dec\n"
            "2026 (load 0.3-0.9, `--n 2000`, the bench venv): raw 161.5 / 165.4 µs")
    assert dated_log_lines(text) == ["1.10×; Ray 968 µs and Monarch 929 µs. Two more on 5 Dec"]


@pytest.mark.parametrize("line", [
    'rlmesh sql 20261202-101500-a1b2 --schema                         # every table and column, with meaning',
    "| `call_one` round trip, async endpoint, quiet | 159–217 µs | raw pyzmq | **1.64–1.98×** (53 runs) |",
    "Clean and faulty runs in one invocation, fixed budget, no early stop, load 0.4–1.5",
    "The trainer warm-starts on demonstrations (`trainer.sft_steps=150`), then runs 30 GRPO steps",
    "- writes a stamp (a hash of `pyproject.toml` and `setup.sh`): a second run only re-checks, until",
])
def test_the_pattern_passes_guides(line):
    assert dated_log_lines(line) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_run_logs(doc):
    lines = dated_log_lines(doc.read_text())
    assert not lines, (f"{doc.relative_to(ROOT)} holds a dated run log; docs are guides in the present tense "
                       "(the current figure, its baseline and the command), history lives in git:\n  "
                       + "\n  ".join(lines))


def test_performance_md_is_one_current_table_per_benchmark():
    n = len((ROOT / "docs" / "performance.md").read_text().splitlines())
    assert n <= PERFORMANCE_MAX_LINES, (f"docs/performance.md has {n} lines (at most {PERFORMANCE_MAX_LINES}): keep one "
                                        "current table per benchmark and move history to commit messages")
