"""``Actor`` and ``@endpoint``: what a user subclasses and decorates.

An actor is a Python object living in a worker proc. Its ``@endpoint`` methods
are what other procs call; everything else is private to it. ``async def``
endpoints run on the proc's event loop (they interleave at ``await``); plain
``def`` endpoints, ``__init__`` and ``on_restart`` run one at a time on the
actor's own thread, so a slow synchronous endpoint never stalls the proc's
networking or its heartbeat.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Concatenate, Coroutine, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")

_ENDPOINT_ATTR = "__rlmesh_endpoint__"

# What an ActorMesh itself defines (rlmesh.actor.mesh.ActorMesh and its base NamedMesh): an endpoint of
# one of these names would be shadowed by the mesh's own attribute, so it is refused at class definition.
# tests/unit/actor/test_endpoint_names.py keeps the set equal to ActorMesh's public attributes.
MESH_ATTRIBUTES = frozenset({"name", "shape", "slice", "proc_ids"})


class EndpointMethod(Generic[P, R]):
    """What a type checker sees for a plain ``def`` method under ``@rm.endpoint``.

    At run time the decorator returns the method itself, marked (nothing is wrapped, so a call
    costs what it did). To a checker, reading it on an actor (``self.where()``) is the method,
    ``Callable[P, R]``, and reading it on ``ActorMesh[A]`` is ``Endpoint[P, R]`` (with the mypy
    plugin ``rlmesh.actor.mypy_plugin``; without it, ``Endpoint[..., Any]``). Never instantiated.
    """

    if TYPE_CHECKING:
        @overload
        def __get__(self, instance: None, owner: type[Any], /) -> EndpointMethod[P, R]: ...
        @overload
        def __get__(self, instance: object, owner: type[Any], /) -> Callable[P, R]: ...
        def __get__(self, instance: object, owner: type[Any], /) -> Any: ...


class AsyncEndpointMethod(Generic[P, R]):
    """:class:`EndpointMethod` of an ``async def`` endpoint: ``R`` is the awaited result (``float``
    for ``async def score(self, text: str) -> float``), what a caller's future holds."""

    if TYPE_CHECKING:
        @overload
        def __get__(self, instance: None, owner: type[Any], /) -> AsyncEndpointMethod[P, R]: ...
        @overload
        def __get__(self, instance: object, owner: type[Any], /) -> Callable[P, Coroutine[Any, Any, R]]: ...
        def __get__(self, instance: object, owner: type[Any], /) -> Any: ...


# An async def matches both; the first, the one wanted, wins (the overlap mypy reports is on purpose).
@overload
def endpoint(  # type: ignore[overload-overlap]
        fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> AsyncEndpointMethod[P, R]: ...
@overload
def endpoint(fn: Callable[Concatenate[Any, P], R]) -> EndpointMethod[P, R]: ...
def endpoint(fn: Any = None) -> Any:
    """Mark an actor method as callable from other procs (``mesh.method.call(...)``).

    Works on ``async def`` and plain ``def`` methods. Applying it to something that
    is not a function (a property, a class, a staticmethod) is an error.
    """
    if fn is None:
        raise TypeError("use @rm.endpoint without parentheses (it takes no options)")
    if isinstance(fn, (staticmethod, classmethod, property)) or not inspect.isfunction(fn):
        raise TypeError(
            f"@rm.endpoint decorates plain instance methods (def or async def), not {type(fn).__name__}"
        )
    setattr(fn, _ENDPOINT_ATTR, True)
    return fn


def is_endpoint(obj: Any) -> bool:
    return callable(obj) and getattr(obj, _ENDPOINT_ATTR, False)


def endpoint_names(cls: type) -> tuple[str, ...]:
    """Endpoints of an actor class, including inherited ones, in definition order."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for name, val in vars(klass).items():
            if is_endpoint(val) and name not in names:
                names.append(name)
    return tuple(names)


class Actor:
    """Base class of every actor. Subclass it, add ``@rm.endpoint`` methods, spawn it on a proc mesh.

    Fault hooks (override as needed):

    - ``on_restart(self)``: runs after ``__init__`` when the actor is re-created in a
      replacement proc (its previous proc died and a ``rm.Restart`` policy allowed a
      restart). Reload state here (a checkpoint, the latest weights). Not called on
      first spawn. It may be ``async``.
    - ``on_stop(self)``: runs when its proc shuts down cleanly (``procs.stop()``);
      not on a crash. It may be ``async``.

    An endpoint may not be named like an attribute of the mesh that calls it (``name``,
    ``shape``, ``slice``, ``proc_ids``) nor start with ``_``: ``mesh.<name>`` would never reach
    it. Such a class is refused where it is defined.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, val in vars(cls).items():
            if not is_endpoint(val):
                continue
            if name in MESH_ATTRIBUTES:
                raise TypeError(
                    f"{cls.__qualname__}.{name}: an endpoint cannot be named {name!r}, it clashes with "
                    f"ActorMesh.{name} (mesh.{name} is the mesh's own attribute, so the endpoint could never "
                    f"be called through a mesh); rename the endpoint, e.g. {name}_ or get_{name}")
            if name.startswith("_"):
                raise TypeError(
                    f"{cls.__qualname__}.{name}: an endpoint name cannot start with '_' (a mesh gives no "
                    f"private attribute as an endpoint, so it could never be called); rename it "
                    f"{name.lstrip('_') or 'something'!r}, or drop @rm.endpoint to keep it private")

    def on_restart(self) -> Any:  # pragma: no cover - default does nothing
        return None

    def on_stop(self) -> Any:  # pragma: no cover - default does nothing
        return None


def validate_actor_class(cls: Any) -> None:
    if not isinstance(cls, type) or not issubclass(cls, Actor):
        what = cls.__name__ if isinstance(cls, type) else type(cls).__name__
        raise TypeError(f"spawn() takes a subclass of rm.Actor, got {what}; write `class {what}(rm.Actor): ...`")
    if not endpoint_names(cls):
        raise TypeError(f"{cls.__name__} has no @rm.endpoint methods: nothing could ever call it")
