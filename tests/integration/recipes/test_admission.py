"""Issue 37 item 3, admission: a recipe that needs far more procs than this host holds is refused
before its run folder or first proc exists, in one line naming the setting and the limit; it used to
fork until the host ran out (``generator.replicas=500``: 33 procs and 8.4 GB in 1.3 s)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HUGE = ["recipe=grpo_addition", "generator.replicas=500", "prompts_per_step=1000", "run.progress=false"]


def run(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR",
                                                            "RLMESH_MAX_PROCS")}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *args], cwd=tmp, env=full,
                          capture_output=True, text=True, timeout=120)


def test_a_plan_larger_than_the_host_is_refused_in_one_line(tmp_path):
    out = run(tmp_path, *HUGE)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("config error: generator.replicas=500 needs 503 procs on this host, which holds "), line
    assert "lower generator.replicas, or set RLMESH_MAX_PROCS=503" in line, line
    assert not list(tmp_path.glob("runs/*/telemetry.duckdb")), "a run was started"
