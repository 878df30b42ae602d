"""Run a controller program given as text in a fresh interpreter, as a user's script would run.

For tests about what a whole process does (which modules it loads, what lands in its run): the
run goes under ``tmp_path/runs``, and the environment carries no job id or secret of the test
process's own controller.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_controller_script(script: str, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLMESH_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    env.pop("RLMESH_JOB_ID", None)
    env.pop("RLMESH_SECRET", None)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
