"""Every public class name in rlmesh is unique across the package.

Why: two classes of one name (two ``TrainResult``, two ``Manifest``) make an import, a traceback or a search
answer ambiguous, and a reader has to check which module a name came from. A new class that takes a name
already used elsewhere fails here, with both places named.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rlmesh"


def public_classes() -> dict[str, list[str]]:
    """Top-level public class names -> the modules that define them."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(PACKAGE.parent)))
    return found


def test_public_class_names_are_unique() -> None:
    classes = public_classes()
    assert len(classes) > 100, "the walk found too few classes: is PACKAGE right?"
    twins = {name: where for name, where in classes.items() if len(where) > 1}
    assert not twins, "public class names defined in more than one module (rename one of each): " + "; ".join(
        f"{name} in {', '.join(where)}" for name, where in sorted(twins.items()))
