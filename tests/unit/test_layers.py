"""The layering of docs/architecture.md, checked: import-linter's contracts, a layer for every
package, and no function-level import without a stated reason.

The contracts themselves live in ``pyproject.toml`` (``[tool.importlinter]``); ``lint-imports``
runs them by hand with the same result.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import rlmesh

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "rlmesh"
DEFERRED = re.compile(r"#\s*deferred:\s*\S")  # the comment a function-level import must carry on one of its lines


def importlinter_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_the_checked_package_is_this_tree():
    assert Path(rlmesh.__file__).resolve().parent == PKG, f"rlmesh comes from {rlmesh.__file__}, not {PKG}"


def test_import_contracts_are_kept():
    # In a subprocess: import-linter reconfigures logging and imports the whole tree, which would leak
    # into the tests that run after this one in the same interpreter (caplog, zmq contexts).
    proc = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[out.find("Broken contracts"):] or out
    assert "0 broken" in out


def test_the_contracts_cover_layers_and_cycles():
    contracts = {c["type"]: c for c in importlinter_config()["contracts"]}
    assert {"layers", "acyclic_siblings"} <= set(contracts)
    assert contracts["acyclic_siblings"]["ancestors"] == ["rlmesh"]
    assert not contracts["layers"].get("ignore_imports"), "the layers hold without exceptions; keep it so"


def layer_members() -> list[set[str]]:
    """Each layer of the layers contract, top first, as its set of module names."""
    (layers,) = [c["layers"] for c in importlinter_config()["contracts"] if c["type"] == "layers"]
    return [{m.strip().strip("()").strip() for m in re.split(r"[:|]", layer)} for layer in layers]


def test_every_module_of_rlmesh_has_a_layer():
    """A new subpackage (or top-level module) must be placed in the contract, or nothing checks it."""
    placed = set().union(*layer_members())
    children = {f"rlmesh.{p.name}" for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    children |= {f"rlmesh.{p.stem}" for p in PKG.glob("*.py") if p.stem != "__init__"}
    unplaced = sorted(children - placed)
    assert not unplaced, (f"{unplaced}: add each to a layer of [[tool.importlinter.contracts]] id='layers' in "
                          "pyproject.toml (bottom to top: settings < transport < errors < actor < launch < telemetry "
                          "< weights < rl < dashboard < recipes/cli; see docs/architecture.md)")


def test_the_layer_order_is_the_documented_one():
    """The contract and docs/architecture.md state the same order."""
    expected = [{"rlmesh.settings"}, {"rlmesh.transport"}, {"rlmesh.errors"}, {"rlmesh.actor"}, {"rlmesh.launch"},
                {"rlmesh.telemetry"}, {"rlmesh.weights"}, {"rlmesh.rl"}, {"rlmesh.dashboard"}, {"rlmesh.recipes", "rlmesh.cli"}]
    bottom_up = layer_members()[::-1]
    assert len(bottom_up) == len(expected) and all(e <= got for e, got in zip(expected, bottom_up)), bottom_up
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert "settings < transport < errors < actor < launch < telemetry < weights < rl < dashboard < recipes" in doc


def undocumented_deferred_imports(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each import inside a function whose lines carry no ``# deferred: <why>``."""
    lines = source.splitlines()
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                if not any(DEFERRED.search(line) for line in lines[child.lineno - 1:child.end_lineno]):
                    found.append((child.lineno, lines[child.lineno - 1].strip()))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(source), False)
    return found


def test_the_deferred_import_check_tells_a_stated_reason_from_none():
    src = '''
import os

def f():
    import torch  # deferred: torch is heavy and only f needs it
    from rlmesh.actor import hooks
    from x import (a,
                   b)  # deferred: optional extra
    import y  # a comment that is not a reason
    return os
'''
    assert [n for n, _ in undocumented_deferred_imports(src)] == [6, 9]


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in PKG.rglob("*.py")))
def test_function_level_imports_say_why(path):
    """Defer an import only for a heavy or optional dependency, saying so on the line:
    ``import torch  # deferred: <why>``. Anything else goes at the top of the module; an import
    deferred to dodge a cycle or an upward import is a layering bug (see docs/architecture.md)."""
    bad = undocumented_deferred_imports((ROOT / path).read_text())
    assert not bad, "\n".join(f"{path}:{n}: {text}  <- move to the top, or add '# deferred: <why>'" for n, text in bad)
