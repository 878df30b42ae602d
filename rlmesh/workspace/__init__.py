"""The controller's directory tree to every host: content-addressed chunks, verified, incremental.

Layer: above ``actor``/``launch``, below ``rl``. So far: the manifest (a walk with
exclusions, chunk hashes, modes, symlinks, refusal of escaping paths) and the
per-host chunk store that materialises a manifest into a directory (temp + verify +
rename, hard links from the store), the chain transfer (:mod:`.transfer`, served by :mod:`.serve`,
one-sided where a device allows: :mod:`.onesided`) and
:func:`sync_workspace` over a ProcMesh (:mod:`.api`), editable installs (:mod:`.editable`) and
live reload (:mod:`.reload`). See docs/workspace.md.
"""

from rlmesh.workspace.manifest import (DEFAULT_EXCLUDES, Entry, HashMismatchError, TreeManifest, UnsafePathError,
                                       build_manifest, check_relpath)
from rlmesh.workspace.api import HostSync, WorkspaceAgent, sync_workspace
from rlmesh.workspace.editable import EditableRoot, editable_roots
from rlmesh.workspace.reload import ProcReload, ReloadMode
from rlmesh.workspace.store import DEFAULT_STORE, ChunkStore, CorruptChunkError, MaterialiseResult, materialise

__all__ = ["DEFAULT_EXCLUDES", "DEFAULT_STORE", "ChunkStore", "CorruptChunkError", "Entry", "TreeManifest", "MaterialiseResult",
           "HashMismatchError", "UnsafePathError", "build_manifest", "check_relpath", "materialise",
           "HostSync", "WorkspaceAgent", "sync_workspace", "EditableRoot", "editable_roots", "ProcReload",
           "ReloadMode"]
