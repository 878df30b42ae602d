"""Editable installs of the user's own packages: found on the controller, synced with the workspace.

Why: ``pip install -e ./mypkg`` puts ``mypkg`` on the controller's path through a ``.pth``
file or an import hook in site-packages, which a remote host's image does not have. A
distribution is *editable* when its ``direct_url.json`` (PEP 610, in the ``.dist-info``
folder) says ``"dir_info": {"editable": true}``. For each one, the directory its
top-level modules are imported from (``src/`` or the project folder) is synced as an
extra tree and put on the workers' ``sys.path`` after the workspace root.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from dataclasses import dataclass
from importlib.metadata import Distribution, distributions

logger = logging.getLogger(__name__)

EDITABLE_DIR = ".rlmesh-editable"
"""Where extra trees land inside a host's destination: ``<dest>/.rlmesh-editable/<dist>/``."""
SKIP_DISTS = frozenset({"rlmesh"})
"""Editable distributions never synced: rlmesh itself is in every worker's image."""


@dataclass(frozen=True)
class EditableRoot:
    """One editable distribution: its name and the directory its modules import from."""

    dist: str
    root: str
    modules: tuple[str, ...]

    @property
    def prefix(self) -> str:
        """Its folder inside a host's destination."""
        return f"{EDITABLE_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', self.dist)}"


def is_editable(dist: Distribution) -> bool:
    """PEP 610: ``direct_url.json`` with ``dir_info.editable`` true."""
    try:
        raw = dist.read_text("direct_url.json")
        return bool(raw) and bool(json.loads(raw or "{}").get("dir_info", {}).get("editable", False))
    except (ValueError, OSError, AttributeError):
        return False


def _top_level(dist: Distribution) -> list[str]:
    """Top-level import names: ``top_level.txt``, else the dist name normalised (``my-pkg`` -> ``my_pkg``)."""
    text = dist.read_text("top_level.txt") or ""
    names = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("_")]
    return names or [re.sub(r"[-.]+", "_", dist.metadata["Name"] or "").lower()]


def _import_root(module: str) -> str | None:
    """The ``sys.path`` directory ``module`` is found in (without importing it), or None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (or namespace package): its folder's parent
        return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))
    if spec.origin and os.path.isfile(spec.origin):
        return os.path.dirname(os.path.abspath(spec.origin))
    return None


def editable_roots(skip: frozenset[str] | set[str] = SKIP_DISTS) -> list[EditableRoot]:
    """Every editable distribution visible to this interpreter whose modules import from a folder
    outside site-packages (names in ``skip`` left out), one entry per import root."""
    out: dict[str, EditableRoot] = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if not name or name.lower() in skip or not is_editable(dist):
            continue
        by_root: dict[str, list[str]] = {}
        for mod in _top_level(dist):
            root = _import_root(mod)
            if root is None or "site-packages" in root.split(os.sep) or "dist-packages" in root.split(os.sep):
                logger.debug("editable %s: module %s not found outside site-packages; not synced", name, mod)
                continue
            by_root.setdefault(root, []).append(mod)
        for root, mods in by_root.items():
            key = name if len(by_root) == 1 else f"{name}-{len(out)}"
            out.setdefault(root, EditableRoot(key, root, tuple(mods)))
    return sorted(out.values(), key=lambda e: e.dist)
