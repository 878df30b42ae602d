"""A mypy plugin: on an ``ActorMesh[A]``, ``mesh.<name>`` has the type of ``A``'s endpoint ``<name>``.

Enable it in your mypy configuration::

    [tool.mypy]
    plugins = ["rlmesh.actor.mypy_plugin"]

Why a plugin: endpoints reach a mesh through ``ActorMesh.__getattr__``, and Python's type system
cannot say "the attributes of ``ActorMesh[A]`` are ``A``'s endpoints, each as an ``Endpoint``". So
``@rm.endpoint`` gives each method a static type that records its parameters and result
(:class:`~rlmesh.actor.actor.EndpointMethod`), and this plugin turns that into ``Endpoint[P, R]``
where a mesh is read: ``mesh.score.call_one("x").get()`` is a ``float`` for
``async def score(self, text: str) -> float``, and ``mesh.helper`` on a method without
``@rm.endpoint`` is an error, as it is at run time. Without the plugin (or under pyright) every
``mesh.<name>`` is ``Endpoint[..., Any]``.

Only mypy imports this module (mypy is in the ``dev`` extra); rlmesh never does.
"""

from __future__ import annotations

from typing import Callable

from mypy.checker import TypeChecker
from mypy.errorcodes import ATTR_DEFINED
from mypy.nodes import Decorator
from mypy.plugin import AttributeContext, Plugin
from mypy.types import AnyType, Instance, Type, TypeOfAny, get_proper_type

MESH = "rlmesh.actor.mesh.ActorMesh"
METHODS = {"rlmesh.actor.actor.EndpointMethod", "rlmesh.actor.actor.AsyncEndpointMethod"}


class RlmeshPlugin(Plugin):
    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        owner, _, name = fullname.rpartition(".")
        if owner != MESH or name.startswith("_"):
            return None
        return lambda ctx: endpoint_type(ctx, name)


def endpoint_type(ctx: AttributeContext, name: str) -> Type:
    """``Endpoint[P, R]`` for ``ActorMesh[A].<name>``, from the static type of ``A.<name>``."""
    mesh = get_proper_type(ctx.type)
    if not isinstance(mesh, Instance) or mesh.type.get(name) is not None or not mesh.args:
        return ctx.default_attr_type  # the mesh's own attribute (a property), or a bare ActorMesh
    actor = get_proper_type(mesh.args[0])
    if not isinstance(actor, Instance):  # ActorMesh[Any], or a type variable: nothing more is known
        return ctx.default_attr_type
    sym = actor.type.get(name)  # looks through the actor's base classes too
    node = sym.node if sym is not None else None
    if isinstance(node, Decorator):
        if node.var.type is None:  # the actor's class body is not checked yet: ask mypy to come back here
            if isinstance(ctx.api, TypeChecker):
                ctx.api.handle_cannot_determine_type(name, ctx.context)
            return AnyType(TypeOfAny.special_form)
        method = get_proper_type(node.var.type)
        default = get_proper_type(ctx.default_attr_type)  # Endpoint[..., Any], from ActorMesh.__getattr__
        if isinstance(method, Instance) and method.type.fullname in METHODS and isinstance(default, Instance):
            return Instance(default.type, list(method.args))  # Endpoint[P, R]
    ctx.api.fail(f'"{actor.type.name}" has no endpoint "{name}" (mark the method with @rm.endpoint '
                 f"to call it through a mesh)", ctx.context, code=ATTR_DEFINED)
    return AnyType(TypeOfAny.from_error)


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point."""
    return RlmeshPlugin
