"""``rlmesh/settings.py`` is the one place ``RLMESH_*`` variables are read, and ``docs/environment.md``
is its text: a module that reads one through ``os.environ``, a name no setting declares, or a doc
that drifted from the module fails here, with the fix in the message.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

from rlmesh import settings

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "rlmesh"
DOC = ROOT / "docs" / "environment.md"
NAME = re.compile(r"RLMESH_[A-Z0-9_]+")
ENV_METHODS = {"get", "pop", "setdefault"}


def test_docs_environment_md_is_generated_from_the_module():
    assert DOC.exists() and DOC.read_text() == settings.markdown(), (
        "docs/environment.md differs from rlmesh/settings.py: run "
        "`.venv/bin/python -m rlmesh.settings --markdown > docs/environment.md`")


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _plain_key(node: ast.AST) -> bool:
    """A key rlmesh may read from ``os.environ`` directly: a literal name that is not one of its own."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and not node.value.startswith(settings.PREFIX)


def environment_reads(source: str) -> list[tuple[int, str]]:
    """``(line, code)`` of each read of one variable from the environment whose key is not a plain
    literal (``os.environ.get("PATH")`` is fine; an ``RLMESH_`` literal or a constant holding a name is
    not). Whole-environment copies (``dict(os.environ)``) and writes are not reads of a variable."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        key: ast.AST | None = None
        if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                (node.func.attr in ENV_METHODS and _is_environ(node.func.value))
                or (node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os")):
            key = node.args[0]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                _is_environ(c) for c in node.comparators):
            key = node.left
        if key is not None and not _plain_key(key):
            found.append((node.lineno, ast.unparse(node)))
    return found


def name_literals(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of each string constant that is exactly an ``RLMESH_*`` name (a name written by
    hand instead of ``settings.X.name``); names inside messages and docstrings are not literals of one."""
    return [(n.lineno, n.value) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value)]


def test_the_checks_tell_a_settings_read_from_a_direct_one():
    src = '''
import os
FOO_ENV = "RLMESH_FOO"
a = os.environ.get(FOO_ENV)
b = os.environ["RLMESH_BAR"]
c = os.getenv("RLMESH_BAZ", "1")
d = os.environ.pop(FOO_ENV, None)
e = "RLMESH_QUX" in os.environ
f = os.environ.get("PATH", "")
g = dict(os.environ)
os.environ[FOO_ENV] = "1"
h = f"set RLMESH_FOO=1 to do it"
'''
    assert [n for n, _ in environment_reads(src)] == [4, 5, 6, 7, 8]
    assert name_literals(src) == [(3, "RLMESH_FOO"), (5, "RLMESH_BAR"), (6, "RLMESH_BAZ"), (8, "RLMESH_QUX")]


SOURCES = sorted(p.relative_to(ROOT).as_posix() for p in PKG.rglob("*.py") if p != PKG / "settings.py")


@pytest.mark.parametrize("path", SOURCES)
def test_rlmesh_variables_are_read_only_through_settings(path):
    source = (ROOT / path).read_text()
    bad = environment_reads(source)
    assert not bad, "\n".join(
        f"{path}:{n}: {code}  <- read it through rlmesh.settings (settings.X.get()); a variable not "
        "declared there yet gets a Setting in rlmesh/settings.py" for n, code in bad)
    names = name_literals(source)
    assert not names, "\n".join(
        f"{path}:{n}: {name!r}  <- use settings.{name.removeprefix(settings.PREFIX)}.name" for n, name in names)


def test_every_rlmesh_name_in_the_package_is_a_setting():
    """Docstrings, comments and messages included: a renamed or removed variable leaves no stale mention."""
    declared = {s.name for s in settings.REGISTRY.values()}
    unknown = sorted({f"{p.relative_to(ROOT)}: {m}" for p in PKG.rglob("*.py")
                      for m in NAME.findall(p.read_text()) if m not in declared})
    assert not unknown, f"{unknown}: declare each in rlmesh/settings.py, or fix the name"


@pytest.mark.parametrize("key", list(settings.REGISTRY))
def test_each_setting_is_documented_and_its_default_is_a_valid_value(key):
    s = settings.REGISTRY[key]
    assert s.name == f"RLMESH_{key}" and s.area in settings.AREAS
    assert s.doc.strip() and s.form.strip(), f"{s.name}: give it a doc and a valid form"
    if s.default_doc is None and s.default not in (None, ""):
        assert s.check(s.default_text()) == s.default, f"{s.name}: its default {s.default!r} does not read back"


def test_the_controller_to_worker_wiring_is_internal():
    internal = {s.name for s in settings.REGISTRY.values() if s.internal}
    assert {"RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_TELEMETRY_ADDR", "RLMESH_TELEMETRY_QUERY_ADDR", "RLMESH_RUN_ID",
            "RLMESH_HB_BOARD", "RLMESH_CAPTURE_DIR", "RLMESH_CAPTURE_STDIO"} <= internal
    assert not internal & {"RLMESH_BIND_HOST", "RLMESH_RUNS_DIR", "RLMESH_LOG_LEVEL", "RLMESH_START_TIMEOUT_S"}


def test_values_are_read_at_call_time_and_empty_is_unset(monkeypatch):
    monkeypatch.delenv("RLMESH_HEALTH_INTERVAL", raising=False)
    assert settings.HEALTH_INTERVAL.get() == 1.0 and not settings.HEALTH_INTERVAL.is_set()
    monkeypatch.setenv("RLMESH_HEALTH_INTERVAL", "0.25")
    assert settings.get("HEALTH_INTERVAL") == 0.25 and settings.setting("RLMESH_HEALTH_INTERVAL").is_set()
    monkeypatch.setenv("RLMESH_HEALTH_INTERVAL", " ")
    assert settings.HEALTH_INTERVAL.get() == 1.0 and settings.HEALTH_INTERVAL.raw() is None
    monkeypatch.setenv("RLMESH_SPANS", "Off")
    assert settings.SPANS.get() is False


def test_a_bad_value_names_the_variable_the_value_and_the_form(monkeypatch, caplog):
    monkeypatch.setenv("RLMESH_HEARTBEAT_TIMEOUT_S", "soon")
    with pytest.raises(settings.SettingError, match=r"^RLMESH_HEARTBEAT_TIMEOUT_S='soon': use a number of seconds > 0$"):
        settings.HEARTBEAT_TIMEOUT_S.get()
    monkeypatch.setenv("RLMESH_PROC_HEALTH_INTERVAL", "-3")  # a sampler's knob: warns once, keeps the default
    with caplog.at_level(logging.WARNING, logger="rlmesh.settings"):
        assert settings.PROC_HEALTH_INTERVAL.get() == 5.0 and settings.PROC_HEALTH_INTERVAL.get() == 5.0
    assert [r.getMessage() for r in caplog.records] == [
        "RLMESH_PROC_HEALTH_INTERVAL='-3': use a number of seconds >= 0; using the default, 5"]


def test_an_unknown_key_says_what_is_close():
    with pytest.raises(KeyError, match="RLMESH_HEALTH is not an rlmesh setting; did you mean RLMESH_HEALTH_INTERVAL"):
        settings.setting("HEALTH")


def test_set_pop_and_setdefault_write_the_environment(monkeypatch):
    monkeypatch.setenv("RLMESH_JOB_ID", "")  # empty is unset; monkeypatch restores the original after
    assert settings.JOB_ID.setdefault("j1") == "j1" and settings.JOB_ID.setdefault("j2") == "j1"
    monkeypatch.setenv("RLMESH_CAPTURE_STDIO", "1")
    assert settings.CAPTURE_STDIO.pop() is True and not settings.CAPTURE_STDIO.is_set()
