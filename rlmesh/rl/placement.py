"""Where a recipe's procs come from and what runs in them: the ``launcher`` config group turned
into something with ``spawn_procs`` (``rm.this_host()`` or a Kubernetes namespace), so the same
recipe runs locally or on a cluster with ``launcher=kubernetes``; and each role's ``_target_``
turned into the actor class to spawn (:func:`actor_class`)."""

from __future__ import annotations

import importlib
from typing import Any

import rlmesh as rm
from rlmesh.launch.kubernetes import KubernetesCluster


def place(launcher: str, settings: dict[str, Any] | None = None) -> Any:
    """``launcher='local'``: this host. ``'kubernetes'``: a ``KubernetesCluster`` built from
    ``settings`` (the ``launcher`` group, fields of ``KubernetesConfig``)."""
    if launcher == "local":
        return rm.this_host()
    if launcher == "kubernetes":
        return KubernetesCluster(dict(settings or {}))
    raise rm.ConfigError(f"launcher={launcher!r} is not a launcher; use launcher=local or launcher=kubernetes")


def actor_class(config: Any, key: str) -> type:
    """The ``rm.Actor`` subclass that role config ``config`` names in ``_target_`` (a dotted
    ``module.Class`` path). ``key`` is the config key it came from (``trainer``), for the error."""
    path = getattr(config, "_target_", None)
    module, _, name = str(path).rpartition(".")
    fix = f"set {key}._target_ to the dotted path of an rm.Actor subclass (module.Class), or pick a {key}= preset"
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError) as exc:
        raise rm.ConfigError(f"{key}._target_={path!r} cannot be imported ({type(exc).__name__}: {exc}); {fix}") from exc
    if not (isinstance(cls, type) and issubclass(cls, rm.Actor)):
        raise rm.ConfigError(f"{key}._target_={path!r} is not an actor class; {fix}")
    return cls
