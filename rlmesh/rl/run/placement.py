"""Where a recipe's procs come from and what runs in them: the ``launcher`` config group turned
into something with ``spawn_procs`` (``rm.this_host()``, a Kubernetes namespace or a Slurm job), so
the same recipe runs locally or on a cluster with ``launcher=kubernetes`` or ``launcher=slurm``; and each role's ``_target_``
turned into the actor class to spawn (:func:`actor_class`); the procs of a trainer mesh
(:func:`trainer_procs`) and the controller's calls to it (:func:`call_trainer`)."""

from __future__ import annotations

import importlib
from typing import Any

import rlmesh as rm
from rlmesh.actor.future import Future, gather_futures
from rlmesh.launch.kubernetes import KubernetesCluster
from rlmesh.launch.slurm import SlurmCluster
from rlmesh.rl.train.recovery import restart_together


def place(launcher: str, settings: dict[str, Any] | None = None) -> Any:
    """``launcher='local'``: this host. ``'kubernetes'``: a ``KubernetesCluster`` built from
    ``settings`` (the ``launcher`` group, fields of ``KubernetesConfig``). ``'slurm'``: a
    ``SlurmCluster`` (fields of ``SlurmConfig``): the job the controller runs in, or one it asks for."""
    if launcher == "local":
        return rm.this_host()
    if launcher == "kubernetes":
        return KubernetesCluster(dict(settings or {}))
    if launcher == "slurm":
        return SlurmCluster(dict(settings or {}))
    raise rm.ConfigError(f"launcher={launcher!r} is not a launcher; use launcher=local, launcher=kubernetes "
                         f"or launcher=slurm")


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


def trainer_procs(procs: Any, first: int, ranks: int) -> Any:
    """The procs the trainer is spawned on: proc ``first`` alone (``trainer.ranks=1``: one actor,
    ``call_one`` works on it), or procs ``first`` to ``first + ranks - 1`` (a trainer mesh), linked so
    that the death of any of them restarts all of them (:mod:`rlmesh.rl.train.recovery`)."""
    if ranks == 1:
        return procs.slice(procs=first)
    mesh = procs.slice(procs=slice(first, first + ranks))
    restart_together(mesh)
    return mesh


def call_trainer(trainer: Any, endpoint: str, *args: Any, timeout: float | None = None) -> Future:
    """Call ``endpoint`` of the trainer; the future holds rank 0's answer. On a trainer mesh every rank
    gets the call (each takes its part in the step, the save or the load), and the first error of any
    rank fails the future (an ``ActorDied`` names the rank's mesh, for recovery)."""
    ep = getattr(trainer, endpoint)
    if timeout is not None:
        ep = ep.options(timeout=timeout)
    if len(trainer) == 1:
        return ep.call_one(*args)
    return gather_futures([ep.call(*args)], lambda values: values[0].values()[0])
