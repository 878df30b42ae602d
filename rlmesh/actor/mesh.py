"""``ActorMesh`` and its endpoint verbs: ``call``, ``call_one``, ``choose``, ``broadcast``, ``stream``.

An ``ActorMesh`` is a plain, picklable description of where its actors live
(actor id, proc id, address, incarnation per point). Calls go from whichever
process holds the handle straight to the hosting procs through that process's
:class:`~rlmesh.actor.client.Client`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import queue
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Generic, Iterator, Literal, ParamSpec, TypeVar, overload

from rlmesh.actor.client import get_client
from rlmesh.actor.future import Future, gather_futures
from rlmesh.actor.shape import NamedMesh, Shape, ValueMesh
from rlmesh.transport.serialization import dumps

if TYPE_CHECKING:
    from rlmesh.actor.actor import Actor

A = TypeVar("A", bound="Actor")  # the actor class of a mesh
P = ParamSpec("P")  # an endpoint's parameters, without self
R = TypeVar("R")  # what an endpoint returns (awaited, for an async def)


@dataclass(frozen=True)
class ActorPoint:
    """One actor of a mesh: its id, and the proc (id, address, incarnation) that hosts it."""

    actor_id: str
    proc_id: str
    addr: str
    incarnation: int


class ActorMesh(NamedMesh, Generic[A]):
    """Handle to a mesh of actors of one class. Attribute access gives endpoints: ``mesh.score.call(x)``.

    ``procs.spawn("scorer", Scorer)`` is an ``ActorMesh[Scorer]``. With the mypy plugin
    ``rlmesh.actor.mypy_plugin``, ``mesh.score`` is then ``Endpoint[(text: str), float]`` to the checker
    (and a name that is no endpoint of ``Scorer`` is an error); without it, ``Endpoint[..., Any]``.
    """

    def __init__(self, name: str, class_name: str, endpoints: tuple[str, ...], points: list[ActorPoint],
                 shape: Shape):
        self._name = name
        self._class_name = class_name
        self._endpoints = endpoints
        self._points = points
        self._shape = shape
        self._rr = itertools.count()
        self._combine: Callable[[list[Any]], ValueMesh[Any]] | None = None  # results -> ValueMesh, made once

    def _point(self, rank: int) -> ActorPoint:
        return self._points[self._shape.indices[rank]]

    def slice(self, **sel: int | slice) -> ActorMesh[A]:
        """Sub-mesh: ``slice(procs=2)`` (one index, dimension dropped), ``slice(procs=slice(0, 2))``."""
        return ActorMesh(self._name, self._class_name, self._endpoints, self._points, self._shape.slice(**sel))

    @property
    def proc_ids(self) -> list[str]:
        """Ids of the procs hosting this mesh's actors, in rank order (for ``ProcMesh.stop(order=...)``)."""
        return [self._point(r).proc_id for r in range(len(self._shape))]

    def __getattr__(self, item: str) -> Endpoint[..., Any]:
        if item.startswith("_"):
            raise AttributeError(item)
        if item not in self._endpoints:
            raise AttributeError(
                f"{self._class_name} has no endpoint {item!r}; endpoints: {', '.join(self._endpoints)}. "
                f"Mark a method with @rm.endpoint to call it remotely")
        # Kept on the handle, so the next ``mesh.<name>`` is a plain attribute read and this method is
        # not called again (~1 µs off every ``mesh.ping.call_one()``). An endpoint holds no state of its
        # own but the mesh and its name (``options`` returns a copy), and ``__reduce__`` leaves it behind.
        ep: Endpoint[..., Any] = Endpoint(self, item)
        self.__dict__[item] = ep
        return ep

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} {self._class_name} {self.shape}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ActorMesh, (self._name, self._class_name, self._endpoints, self._points, self._shape))


class Endpoint(Generic[P, R]):
    """One endpoint of a mesh, with the call verbs. ``options(timeout=...)`` returns a configured copy.

    ``P`` are the endpoint method's parameters (without ``self``) and ``R`` its result, so a checker
    follows ``mesh.score.call_one("x").get()`` to ``float`` for ``async def score(self, text: str) -> float``.
    """

    def __init__(self, mesh: ActorMesh[Any], name: str, timeout: float | None = None):
        self._mesh = mesh
        self._name = name
        self._timeout = timeout

    def options(self, *, timeout: float | None = None) -> Endpoint[P, R]:
        """Per-call options: ``timeout`` seconds, after which the future fails with ``rm.CallTimeout``."""
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        return Endpoint(self._mesh, self._name, timeout)

    @overload
    def _send(self, rank: int, payload: list[Any]) -> Future[Any]: ...
    @overload
    def _send(self, rank: int, payload: list[Any], want_reply: Literal[False]) -> None: ...
    def _send(self, rank: int, payload: list[Any], want_reply: bool = True) -> Future[Any] | None:
        mesh = self._mesh
        base = mesh._shape.indices[rank]  # the rank in the whole mesh; _point, inline: this runs on every call
        p = mesh._points[base]
        return get_client().call(
            p.proc_id, p.addr, p.incarnation, p.actor_id, mesh._name, base,
            self._name, (), {}, want_reply=want_reply, timeout=self._timeout, payload=payload)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call every actor; the future holds a :class:`ValueMesh` (fails with the first error)."""
        payload = dumps((args, kwargs))
        mesh = self._mesh
        futs = [self._send(r, payload) for r in range(len(mesh))]
        combine = mesh._combine
        if combine is None:  # the mesh's shape never changes (a slice is a new mesh): one per mesh, not per call
            combine = mesh._combine = functools.partial(ValueMesh, Shape(mesh.shape))
        return gather_futures(futs, combine)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the single actor of a one-actor mesh (slice first); a larger mesh is an error."""
        n = len(self._mesh._shape.indices)  # len(self._mesh), two calls fewer on every call_one
        if n != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly one actor, {self._mesh.name!r} has {n} {self._mesh.shape}; "
                f"slice it first (mesh.slice(procs=0).{self._name}.call_one(...)) or use call/choose")
        return self._send(0, dumps((args, kwargs)))

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one actor: the one with the fewest calls outstanding from this process (ties round-robin),
        among those whose proc is not known to be dead (a proc being restarted is skipped while others serve)."""
        n = len(self._mesh)
        client = get_client()
        start = next(self._mesh._rr)
        best, best_load = 0, None
        for i in range(n):
            r = (start + i) % n
            entry = client.directory.get(self._mesh._point(r).proc_id)
            down = entry is not None and not entry.alive
            load = client.outstanding(self._mesh._point(r).actor_id) + (1 << 30 if down else 0)
            if best_load is None or load < best_load:
                best, best_load = r, load
                if load == 0:
                    break
        return self._send(best, dumps((args, kwargs)))

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every actor without waiting or collecting results (errors are logged by the actor)."""
        payload = dumps((args, kwargs))
        for r in range(len(self._mesh)):
            self._send(r, payload, want_reply=False)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Stream[R]:
        """Call every actor; iterate results as they arrive (``async for`` or plain ``for``)."""
        payload = dumps((args, kwargs))
        return Stream([self._send(r, payload) for r in range(len(self._mesh))])

    def __repr__(self) -> str:
        return f"<Endpoint {self._mesh.name}.{self._name}>"


class Stream(Generic[R]):
    """Results of a mesh-wide call in completion order. Raises the first error when it is reached."""

    def __init__(self, futs: list[Future[R]]):
        self._futs = futs
        self._q: queue.SimpleQueue[Future[R]] = queue.SimpleQueue()
        for f in futs:
            f.add_done_callback(self._q.put)

    def __iter__(self) -> Iterator[R]:
        get_client().send_held()  # a plain loop over it blocks this thread: its loop's held calls go now
        for _ in self._futs:
            yield self._q.get().get()

    async def __aiter__(self) -> AsyncIterator[R]:
        for aw in asyncio.as_completed(self._futs):
            yield await aw
