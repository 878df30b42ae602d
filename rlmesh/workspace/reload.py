"""New code in a live run: reload changed modules in a proc where that is safe, say where it is not.

Rule (docs/workspace.md, "Code changes in a live run"): a changed module that this proc has
imported is **reloaded in place** (``importlib.reload``) unless it defines an ``rm.Actor``
subclass or holds an ``rm.Actor`` instance at module level; those are **unsafe** (a live
actor's ``self`` keeps its old class, and the worker holds references to its bound
endpoints), and the proc must be restarted to run the new code. After a reload, names
other modules of the synced tree bound with ``from mod import f`` are re-pointed to the new
objects, so an actor module that did ``from myreward import score`` calls the new ``score``
on its next call. Modules not imported yet need nothing: the next import reads the new file.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from types import ModuleType

from rlmesh.actor import Actor

logger = logging.getLogger(__name__)


class ReloadMode(StrEnum):
    """``sync_workspace(reload=...)``."""

    OFF = "off"
    """Land the files only; running code is untouched (new imports see the new files)."""
    MODULES = "modules"
    """Reload safe changed modules; procs with unsafe ones are only reported (``ProcReload.unsafe``)."""
    AUTO = "auto"
    """Reload safe changed modules and restart the procs that imported an unsafe one."""


@dataclass
class ProcReload:
    """What one proc did with a sync's changes."""

    rank: int
    reloaded: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)
    """Changed modules defining actor classes (or holding actors): need a restart."""
    errors: list[str] = field(default_factory=list)
    """``module: Exception`` for a reload that raised (the module keeps whatever it had)."""
    restarted: bool = False


def _module_file(mod: ModuleType) -> str | None:
    f = getattr(mod, "__file__", None)
    return os.path.realpath(f) if isinstance(f, str) else None


def is_unsafe(mod: ModuleType) -> bool:
    """Defines an ``rm.Actor`` subclass, or holds an actor instance, at module level."""
    for v in list(vars(mod).values()):
        if isinstance(v, type) and issubclass(v, Actor) and v.__module__ == mod.__name__:
            return True
        if isinstance(v, Actor):
            return True
    return False


def _drop_bytecode(path: str) -> None:
    """A same-size edit within one second leaves a ``.pyc`` that looks fresh: remove it."""
    try:
        os.unlink(importlib.util.cache_from_source(path))
    except (OSError, ValueError, NotImplementedError):
        pass


def reload_changed(roots: list[str], changed_files: list[str], dry: bool = False) -> ProcReload:
    """Reload this process's modules whose file is in ``changed_files`` (absolute paths), where safe.

    ``roots``: the synced folders; only modules under them are re-pointed after a reload."""
    importlib.invalidate_caches()
    changed = {os.path.realpath(p) for p in changed_files}
    real_roots = tuple(os.path.realpath(r) + os.sep for r in roots)
    ours = [m for m in list(sys.modules.values()) if isinstance(m, ModuleType)
            and (_module_file(m) or "").startswith(real_roots)]
    out = ProcReload(rank=-1)
    for path in changed:  # also for modules a restart will import: a stale .pyc must not stand in for them
        if path.endswith(".py"):
            _drop_bytecode(path)
    for mod in ours:
        path = _module_file(mod)  # type: ignore[assignment]  # modules in `ours` have a file
        if path not in changed:
            continue
        if mod.__name__.split(".")[0] == "rlmesh" or is_unsafe(mod):  # rlmesh's own code: never in place
            out.unsafe.append(mod.__name__)
            continue
        if dry:
            continue
        old = dict(vars(mod))
        try:
            importlib.reload(mod)
        except Exception as exc:  # noqa: BLE001 - reported per module; the old objects stay in place
            out.errors.append(f"{mod.__name__}: {type(exc).__name__}: {exc}")
            continue
        out.reloaded.append(mod.__name__)
        _repoint(mod, old, ours)
    return out


def _repoint(mod: ModuleType, old: dict[str, object], ours: list[ModuleType]) -> None:
    """Names bound from ``mod``'s old objects in other synced modules now name the new ones."""
    swap = {id(v): k for k, v in old.items() if not k.startswith("__") and getattr(v, "__module__", None) == mod.__name__}
    if not swap:
        return
    for other in ours:
        if other is mod:
            continue
        for name, v in list(vars(other).items()):
            k = swap.get(id(v))
            if k is not None and old.get(k) is v and hasattr(mod, k):
                setattr(other, name, getattr(mod, k))
