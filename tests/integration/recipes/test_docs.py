"""Every ```python block of docs/recipes.md and docs/extending.md runs, top to bottom, as one script
in a fresh controller (a temporary working directory, so the runs it makes land there)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def blocks(doc: str) -> str:
    return "\n\n".join(re.findall(r"```python\n(.*?)```", (ROOT / "docs" / doc).read_text(), flags=re.S))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("doc", ["recipes.md", "extending.md"])
def test_doc_snippets_run(doc, tmp_path):
    script = tmp_path / "snippets.py"
    script.write_text(blocks(doc))
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["RLMESH_HEALTH_INTERVAL"] = "0"
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=190)
    assert out.returncode == 0, out.stderr[-4000:]
