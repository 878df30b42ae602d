"""Where a recipe's procs come from and what runs in them: the ``launcher`` config group turned
into something with ``spawn_procs`` (``rm.this_host()``, a Kubernetes namespace or a Slurm job), so
the same recipe runs locally or on a cluster with ``launcher=kubernetes`` or ``launcher=slurm``; and each role's ``_target_``
turned into the actor class to spawn (:func:`actor_class`), checked before any proc starts without
importing it (:func:`check_target`); the procs of a trainer mesh (:func:`trainer_procs`) and the
controller's calls to it (:func:`call_trainer`)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import threading
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


def _target(config: Any, key: str) -> tuple[str, str, str, str]:
    """``(path, module, class name, fix)`` of role config ``config``'s ``_target_``."""
    path = getattr(config, "_target_", None)
    module, _, name = str(path).rpartition(".")
    fix = f"set {key}._target_ to the dotted path of an rm.Actor subclass (module.Class), or pick a {key}= preset"
    return str(path), module, name, fix


def actor_class(config: Any, key: str) -> type:
    """The ``rm.Actor`` subclass that role config ``config`` names in ``_target_`` (a dotted
    ``module.Class`` path). ``key`` is the config key it came from (``trainer``), for the error."""
    path, module, name, fix = _target(config, key)
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError) as exc:
        raise rm.ConfigError(f"{key}._target_={path!r} cannot be imported ({type(exc).__name__}: {exc}); {fix}") from exc
    if not (isinstance(cls, type) and issubclass(cls, rm.Actor)):
        raise rm.ConfigError(f"{key}._target_={path!r} is not an actor class; {fix}")
    return cls


def check_target(config: Any, key: str) -> None:
    """Fail now, with :func:`actor_class`'s :class:`~rlmesh.ConfigError`, if ``config``'s ``_target_``
    names no class, and start importing its module on a background thread.

    Why: an algorithm's module imports torch (~1.5 s of CPU), and a recipe that imported it before
    starting its procs put that import on the path to the first train step, while ``spawn_procs``
    then only waited for the procs' template. A recipe calls this before any proc starts, so a
    mistyped module or class still fails first, and :func:`actor_class` in its ``spawn`` function,
    which finds the module imported (or waits for the import to finish). The check runs no module:
    it finds it (``importlib.util.find_spec``) and reads its source for a top-level definition of the
    name; a lazy package (a module ``__getattr__``) is imported, cheap by design, and its ``__all__``
    asked. What the source does not show (a compiled module, a name made at run time) is imported
    now, as before. A background import that fails is imported again, and reported, by
    :func:`actor_class`."""
    path, module, name, _ = _target(config, key)
    loaded = sys.modules.get(module)
    if module and not (loaded is not None and name in vars(loaded)) and _defines(module, name):
        with _IMPORTING_LOCK:
            if path in _IMPORTING:
                return
            _IMPORTING.add(path)
        threading.Thread(target=_import_quietly, args=(module, name), name=f"rlmesh-import-{key}", daemon=True).start()
        return
    actor_class(config, key)  # imported already (the check costs nothing), or not to be told from the source


_IMPORTING: set[str] = set()
"""The ``_target_`` paths :func:`check_target` started importing (one thread each)."""
_IMPORTING_LOCK = threading.Lock()


def _import_quietly(module: str, name: str) -> None:
    try:
        getattr(importlib.import_module(module), name)  # a lazy package imports the class's module here
    except BaseException:  # noqa: BLE001 - actor_class imports it again in the recipe's spawn and says why
        pass


def _defines(module: str, name: str) -> bool:
    """Whether ``module``'s source binds ``name`` at its top level (or its lazy ``__all__`` lists it),
    found without running the module; False when that cannot be told so."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return False
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), spec.origin)
    except (ImportError, ValueError, OSError, SyntaxError):
        return False
    names = _top_level_names(tree.body)
    if name in names:
        return True
    if "__getattr__" in names:  # a lazy package: importing it loads none of what it names
        try:
            return name in getattr(importlib.import_module(module), "__all__", ())
        except Exception:  # noqa: BLE001 - actor_class imports it again and reports the error
            return False
    return False


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """Names bound by a module body's statements (inside top-level ``if``/``try`` blocks too)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = list(node.targets if isinstance(node, ast.Assign) else [node.target])
            while targets:  # `A = ...`, `A, B = ...`; not `a.b = ...` (binds no name of the module)
                t = targets.pop()
                if isinstance(t, ast.Name):
                    names.add(t.id)
                elif isinstance(t, (ast.Tuple, ast.List)):
                    targets.extend(t.elts)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If):  # an `if TYPE_CHECKING:` body binds nothing when the module runs
            checking = "TYPE_CHECKING" in {getattr(node.test, "id", None), getattr(node.test, "attr", None)}
            names |= (set() if checking else _top_level_names(node.body)) | _top_level_names(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                names |= _top_level_names(block)
    return names


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
