"""The recipe option ``workspace.*``: the controller's project folder reaches the recipe's worker procs.

    rlmesh run recipe=grpo_addition reward._target_=myproject.rewards.MyReward workspace.sync=true

Why in the recipe layer: a recipe names actor classes by dotted path (``reward._target_``);
with the sync on, the folder ``workspace.path`` is first on the controller's ``sys.path``
before those classes are imported (:func:`activate_on_controller`), and it lands on every
host of the recipe's procs, first on their ``sys.path``, before any actor of the recipe is
created (:func:`sync_recipe_procs`). Default: on for ``launcher=kubernetes`` (a pod's image
does not hold your project), off for ``launcher=local`` (the procs share this filesystem).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, List, Optional

from rlmesh.rl.config import check
from rlmesh.workspace import DEFAULT_STORE, sync_workspace

logger = logging.getLogger(__name__)


@dataclass
class WorkspaceConfig:
    """Whether and what of the controller's folder the recipe's procs import (docs/workspace.md)."""

    sync: Optional[bool] = None
    """null: on for launcher=kubernetes, off for launcher=local and launcher=slurm (a cluster's shared
    filesystem already holds the project); true/false decide for every launcher."""
    path: str = "."
    """The folder synced (relative to where ``rlmesh run`` starts)."""
    exclude: List[str] = field(default_factory=list)
    """Patterns left out, besides ``.git``, ``.venv*``, ``runs/``, ``__pycache__`` and the folder's ``.gitignore``."""
    editable: bool = True
    """Also sync the folders of this interpreter's editable installs (``pip install -e``), rlmesh's excepted."""
    chdir: bool = False
    """Make the landed folder the working directory of every proc (relative data paths then resolve)."""
    store_dir: str = DEFAULT_STORE
    """Each host's chunk store (a chunk held there from any earlier sync is not sent again)."""
    dest_root: str = ""
    """Where trees land on each host ("" = ``~/.cache/rlmesh/workspaces``), one folder per run."""
    simulate_hosts: bool = False
    """Every proc acts as its own host (own store and copy): how tests exercise the transfer on one machine."""
    timeout_s: float = 120.0
    """A host's pull fails after this long without progress (what it stored is kept; a rerun resumes)."""

    def __post_init__(self) -> None:
        check(self.timeout_s > 0, "workspace.timeout_s", self.timeout_s, "use a positive number of seconds")
        check(bool(self.path), "workspace.path", self.path, "name the folder to sync (workspace.path=.)")
        if self.sync:
            check(os.path.isdir(self.path), "workspace.path", self.path,
                  f"the folder to sync does not exist (from {os.getcwd()}): set workspace.path=/your/project")

    def enabled(self, launcher: str) -> bool:
        """``sync`` if set, else on for Kubernetes only."""
        return self.sync if self.sync is not None else launcher == "kubernetes"


def activate_on_controller(cfg: Any, launcher: str) -> str | None:
    """With the sync on, put ``workspace.path`` first on this process's ``sys.path`` (the recipe's
    ``_target_`` classes import from it, as the workers' will); returns the folder, or None."""
    ws: WorkspaceConfig | None = getattr(cfg, "workspace", None)
    if ws is None or not ws.enabled(launcher):
        return None
    root = os.path.abspath(ws.path)
    if root in sys.path:
        sys.path.remove(root)
    sys.path.insert(0, root)
    return root


def sync_recipe_procs(cfg: Any, launcher: str, procs: Any, run_id: str | None) -> list[Any]:
    """Sync ``workspace.path`` to ``procs`` before the recipe spawns its actors; the ``HostSync`` rows
    (also ``file_syncs`` rows in telemetry), or ``[]`` when the sync is off."""
    ws: WorkspaceConfig | None = getattr(cfg, "workspace", None)
    if ws is None or not ws.enabled(launcher):
        return []
    rows = sync_workspace(procs, ws.path, tuple(ws.exclude), store_dir=ws.store_dir, dest_root=ws.dest_root or None,
                          run_id=run_id or "", simulate_hosts=ws.simulate_hosts, chdir=ws.chdir, editable=ws.editable,
                          timeout=ws.timeout_s)
    for r in rows:
        logger.info("workspace %s -> %s:%s (%d files, %d bytes sent, %s)", ws.path, r.host, r.dest, r.stats.files,
                    r.stats.bytes_received, r.stats.transport)
    return rows
