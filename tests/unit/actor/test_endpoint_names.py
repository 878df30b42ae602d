"""An endpoint a mesh could never reach is refused where its class is defined (``rm.Actor.__init_subclass__``).

``mesh.<name>`` reads the mesh's own attribute first (``name``, ``shape``, ``slice``, ``proc_ids``), and
``ActorMesh.__getattr__`` gives no ``_private`` name as an endpoint: such an endpoint was silently shadowed.
"""

from __future__ import annotations

import pytest

import rlmesh as rm
from rlmesh.actor.actor import MESH_ATTRIBUTES, endpoint_names
from rlmesh.actor.mesh import ActorMesh


def test_the_reserved_names_are_the_public_attributes_of_an_actor_mesh():
    public = {n for n in dir(ActorMesh) if not n.startswith("_")}
    assert public == MESH_ATTRIBUTES, "keep rlmesh.actor.actor.MESH_ATTRIBUTES equal to ActorMesh's attributes"


@pytest.mark.parametrize("name", sorted(MESH_ATTRIBUTES))
@pytest.mark.parametrize("is_async", [False, True])
def test_an_endpoint_named_like_a_mesh_attribute_is_an_error_at_class_definition(name, is_async):
    async def async_ep(self):
        return 1

    def sync_ep(self):
        return 1

    with pytest.raises(TypeError) as err:
        type("Clash", (rm.Actor,), {name: rm.endpoint(async_ep if is_async else sync_ep)})
    msg = str(err.value)
    assert f"Clash.{name}" in msg  # the endpoint
    assert f"ActorMesh.{name}" in msg  # the clash
    assert "rename the endpoint" in msg and f"{name}_" in msg  # the fix


def test_the_error_points_at_the_class_statement():
    with pytest.raises(TypeError, match=r"Scorer\.shape: an endpoint cannot be named 'shape'"):
        class Scorer(rm.Actor):
            @rm.endpoint
            def shape(self) -> tuple[int, ...]:
                return (1,)


def test_a_private_endpoint_is_an_error():
    with pytest.raises(TypeError, match=r"Secret\._peek: an endpoint name cannot start with '_'.*'peek'"):
        class Secret(rm.Actor):
            @rm.endpoint
            def _peek(self) -> int:
                return 1


def test_a_subclass_is_checked_and_plain_methods_of_those_names_stay_allowed():
    class Base(rm.Actor):
        @rm.endpoint
        def score(self) -> int:
            return 1

        def name(self) -> str:  # not an endpoint: never reached through a mesh, nothing shadows it
            return "base"

        def _helper(self) -> int:
            return 2

    assert endpoint_names(Base) == ("score",)
    with pytest.raises(TypeError, match=r"Child\.slice"):
        class Child(Base):
            @rm.endpoint
            def slice(self) -> int:
                return 3
