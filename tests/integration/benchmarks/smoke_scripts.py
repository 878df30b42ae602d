"""Which ``benchmarks/*.py`` scripts the smoke tests run, and how one is run and checked.

Every script in ``benchmarks/`` (a file with a ``__main__`` block; not the ``_helpers`` nor a module
other procs import, such as ``bench_shaped_actors.py``) is found by listing the folder, so a new script
is covered the day it lands: it must accept ``--smoke`` (tiny sizes, a few seconds) and ``--json PATH``,
exit 0, print the ``# versions:`` banner and at least one ``ratio ...`` line (or say which baseline it
could not run), and write its JSON. A script with a test of its own here
(``test_<name>_smoke.py``: the long LLM ones) is checked there instead. The scripts are split between
two test files by their place in the sorted list, so two pytest-xdist workers share them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BENCHMARKS = ROOT / "benchmarks"
HERE = Path(__file__).resolve().parent
RATIO = re.compile(r"^ratio .+?: median [\d.]+x p90 [\d.]+x over \d+ rounds", re.M)
NOT_RUN = re.compile(r"^baseline .+?: not run: .+", re.M)


AWAITING_SMOKE: dict[str, str] = {}
"""Scripts whose smoke mode is not in yet: their test is an expected failure, said as such, until it is."""


def scripts(part: int, parts: int = 2) -> list[str]:
    """The script names (``telemetry``) this test file runs: every ``parts``-th, from ``part``."""
    names = sorted(p.stem for p in BENCHMARKS.glob("*.py")
                   if not p.name.startswith("_") and 'if __name__ == "__main__"' in p.read_text())
    names = [n for n in names if not (HERE / f"test_{n}_smoke.py").exists()]
    return names[part::parts]


def run_smoke(name: str, tmp_path: Path, timeout: float) -> tuple[str, dict]:
    """Run ``benchmarks/<name>.py --smoke --json`` as a user would, from an empty directory; check it."""
    source = (BENCHMARKS / f"{name}.py").read_text()
    assert "add_common_args" in source or ("--smoke" in source and "--json" in source), (
        f"benchmarks/{name}.py has no --smoke or --json option: give it both (benchmarks/_common.add_common_args) "
        "and print its figures through benchmarks/_common.Report")
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", "--json", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    text = proc.stdout
    assert proc.returncode == 0, f"{name} --smoke exited {proc.returncode}:\n{text[-4000:]}\n{proc.stderr[-4000:]}"
    assert "# versions:" in text, f"{name} --smoke printed no banner:\n{text[-3000:]}"
    assert RATIO.search(text) or NOT_RUN.search(text), f"{name} --smoke printed no ratio line:\n{text[-3000:]}"
    assert out.exists(), f"{name} --smoke wrote no JSON to --json {out}:\n{text[-3000:]}"
    data = json.loads(out.read_text())
    assert data["smoke"] is True and "load_start" in data and "versions" in data, data
    assert data["ratios"] or data["not_run"], f"{name}: no ratios and no baseline said not run in its JSON"
    for r in data["ratios"]:
        assert r["rounds"] and all(x > 0 for x in r["rounds"]), r
    return text, data
