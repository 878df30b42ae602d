"""Every python snippet in docs/weights.md runs as written."""

import os
import re

import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "weights.md")


def snippets():
    with open(DOC) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("i", range(len(snippets())))
def test_snippet_runs(i):
    exec(compile(snippets()[i], f"docs/weights.md snippet {i}", "exec"), {})
