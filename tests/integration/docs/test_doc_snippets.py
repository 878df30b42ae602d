"""Every ```python block of the runtime docs runs, top to bottom, as one script in a fresh controller."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def blocks(doc: str) -> str:
    text = open(os.path.join(ROOT, "docs", doc)).read()
    return "\n\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("doc", ["actors.md", "workspace.md"])
def test_doc_runs(doc, tmp_path):
    script = tmp_path / "snippets.py"
    script.write_text(blocks(doc))
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=110)
    assert out.returncode == 0, out.stderr[-4000:]
