"""``ProcMesh``: a mesh of worker procs you spawn actors on, slice, and stop.

    with rm.this_host().spawn_procs(per_host={"procs": 4}) as procs:
        trainer = procs.slice(procs=0).spawn("trainer", Trainer)
        gens = procs.slice(procs=slice(1, 4)).spawn("gen", Generator, env="CartPole-v1")
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Sequence, TypeVar

import cloudpickle

from rlmesh.actor.actor import endpoint_names, validate_actor_class
from rlmesh.actor.controller import Controller, Launcher, Restart, call_launchers
from rlmesh.actor.mesh import ActorMesh, ActorPoint
from rlmesh.actor.proc_state import ProcState
from rlmesh.actor.shape import NamedMesh, Shape
from rlmesh.transport.serialization import dumps

if TYPE_CHECKING:
    from rlmesh.actor.actor import Actor

A = TypeVar("A", bound="Actor")


def ship_by_value_if_needed(cls: type) -> None:
    """Make cloudpickle send ``cls``'s module by value when a worker could not import it by name.

    ``__main__`` (scripts, notebooks) is by value already; this covers modules loaded
    from a file path (pytest's importlib mode, ``runpy``, exec'd code) whose name does
    not resolve to the same file through ``sys.path``.
    """
    name = cls.__module__
    mod = sys.modules.get(name)
    if name == "__main__" or mod is None:
        return
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    here = getattr(mod, "__file__", None)
    if spec is None or (here and spec.origin and os.path.realpath(spec.origin) != os.path.realpath(here)):
        cloudpickle.register_pickle_by_value(mod)


class ProcMesh(NamedMesh):
    """Handle to procs started by one ``spawn_procs`` call (or a slice of them)."""

    def __init__(self, name: str, proc_ids: list[str], shape: Shape, controller: Controller,
                 root: bool = True):
        self._name = name
        self._proc_ids = proc_ids
        self._shape = shape
        self._controller = controller
        self._root = root
        self._actor_names: set[str] = set()

    @classmethod
    def launch(cls, name: str, dims: dict[str, int], launcher: Launcher, restart: Restart | None = None,
               env: dict[str, str] | None = None, timeout: float | None = None) -> "ProcMesh":
        shape = Shape(dims)
        controller = Controller.get()
        recs = controller.launch_procs(name, len(shape), launcher, restart or Restart(), env, timeout)
        return cls(name, [r.proc_id for r in recs], shape, controller)

    def _records(self) -> list[Any]:
        return [self._controller.procs[p] for p in self.proc_ids]

    @property
    def proc_ids(self) -> list[str]:
        """Ids of this mesh's procs (of a slice, its own), in rank order: the keys of ``Controller.procs``,
        and what ``stop(order=...)`` takes (as ``ActorMesh.proc_ids``)."""
        return [self._proc_ids[i] for i in self._shape.indices]

    @property
    def pids(self) -> list[int | None]:
        """Current OS pids, in rank order (they change when a proc is restarted)."""
        return [r.pid for r in self._records()]

    def incarnations(self) -> list[int]:
        """How many times each proc has been replaced (0 = still the first process), in rank order."""
        return [r.incarnation for r in self._records()]

    def states(self) -> list[str]:
        """Supervisor state per proc: alive, starting, rejoining, restarting, dead, failed, stopped."""
        return [r.state for r in self._records()]

    def wait_alive(self, timeout: float = 30.0) -> None:
        """Block until every proc of this mesh is alive again (e.g. after a restart)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.states()
            if all(s == ProcState.ALIVE for s in states):
                return
            if any(s in (ProcState.FAILED, ProcState.STOPPED) for s in states):
                raise RuntimeError(f"procs of {self._name!r} will not come back: {states}")
            time.sleep(0.01)
        raise TimeoutError(f"procs of {self._name!r} not all alive after {timeout}s: {self.states()}")

    def slice(self, **sel: int | slice) -> "ProcMesh":
        """Sub-mesh of these procs: ``slice(procs=0)`` or ``slice(procs=slice(1, 4))``."""
        sub = ProcMesh(self._name, self._proc_ids, self._shape.slice(**sel), self._controller, root=False)
        sub._actor_names = self._actor_names
        return sub

    def spawn(self, name: str, actor_cls: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Create one ``actor_cls(*args, **kwargs)`` per proc; returns the :class:`ActorMesh`.

        Blocks until every ``__init__`` finished; an exception in one is raised as
        ``rm.ActorError`` with its remote traceback. Arguments are kept so a
        restarted proc re-creates the actor exactly as first built.
        """
        validate_actor_class(actor_cls)
        live = (r for r in self._controller.procs.values() if r.state not in (ProcState.STOPPED, ProcState.FAILED))
        if name in self._actor_names or any(spec["mesh"] == name for r in live for spec, _ in r.actors):
            raise ValueError(f"an actor mesh named {name!r} exists already; choose another name")
        self._actor_names.add(name)
        ship_by_value_if_needed(actor_cls)
        payload = dumps((actor_cls, args, kwargs))
        eps = endpoint_names(actor_cls)
        dims = self._shape.dims
        actor_shape = Shape(dims)
        placements: list[tuple[str, dict[str, Any]]] = []
        for rank in range(len(self._shape)):
            proc_id = self._proc_ids[self._shape.indices[rank]]
            placements.append((proc_id, {
                "actor_id": f"{name}/{rank}", "mesh": name, "rank": rank, "shape": dims,
                "coords": actor_shape.coords(rank), "endpoints": eps,
            }))
        where = self._controller.spawn_actors(placements, payload)
        points = [ActorPoint(spec["actor_id"], proc_id, *where[spec["actor_id"]]) for proc_id, spec in placements]
        return ActorMesh(name, actor_cls.__qualname__, eps, points, actor_shape)

    def stop(self, timeout: float = 5.0, order: Sequence[Sequence[str]] = ()) -> None:
        """Stop these procs: actors' ``on_stop`` run, shutdown hooks run, processes exit.

        ``order``: groups of proc ids stopped one group after the other, each waited for (up to
        ``timeout``, then killed) before the next gets its stop; the procs no group names go last.
        Stop callers before what they call (the procs that issue calls first, then the ones they
        call), so no actor's call meets a peer that has already stopped."""
        mine = self.proc_ids
        left = dict.fromkeys(mine)
        for group in (*order, mine):
            ids = [p for p in group if p in left]
            for p in ids:
                del left[p]
            if ids:
                self._controller.stop_procs(ids, timeout)
        if self._root:  # the whole mesh is gone: launchers drop what they keep for it (a warm template)
            recs = [r for p in self._proc_ids if (r := self._controller.procs.get(p)) is not None]
            call_launchers((r.launcher for r in recs), "release", self._name)

    def __enter__(self) -> "ProcMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ProcMesh {self._name!r} {self.shape}>"
