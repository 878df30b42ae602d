import asyncio
import threading
import time

import pytest

import rlmesh as rm
from rlmesh.actor.actor import endpoint_names, validate_actor_class
from rlmesh.actor.future import Future, gather_futures
from rlmesh.actor.kv import LocalKV
from rlmesh.actor.shape import Shape, ValueMesh


def test_shape_coords_and_ranks_row_major():
    s = Shape({"hosts": 2, "gpus": 3})
    assert len(s) == 6
    assert s.coords(4) == {"hosts": 1, "gpus": 1}
    assert s.rank_of({"hosts": 1, "gpus": 2}) == 5
    assert s.rank_of((0, 1)) == 1


def test_slice_int_drops_dim_and_slice_keeps_it():
    s = Shape({"hosts": 2, "gpus": 3})
    one = s.slice(hosts=1)
    assert one.dims == {"gpus": 3} and one.indices == (3, 4, 5)
    part = s.slice(gpus=slice(1, 3))
    assert part.dims == {"hosts": 2, "gpus": 2} and part.indices == (1, 2, 4, 5)
    nested = part.slice(hosts=0, gpus=1)
    assert nested.dims == {} and nested.indices == (2,)


def test_slice_errors_name_the_problem():
    s = Shape({"procs": 4})
    with pytest.raises(KeyError, match="no dimension"):
        s.slice(gpus=0)
    with pytest.raises(IndexError):
        s.slice(procs=4)
    with pytest.raises(IndexError, match="selects nothing"):
        s.slice(procs=slice(3, 1))
    with pytest.raises(ValueError):
        Shape({"procs": 0})


def test_value_mesh_indexing():
    vm = ValueMesh(Shape({"a": 2, "b": 2}), [10, 11, 12, 13])
    assert vm[2] == 12 and vm[{"a": 1, "b": 1}] == 13 and vm[(0, 1)] == 11
    assert list(vm) == [10, 11, 12, 13] and vm.values() == [10, 11, 12, 13]
    assert list(vm.items())[1] == ({"a": 0, "b": 1}, 11)


def test_future_get_await_and_timeout():
    f: Future = Future()
    with pytest.raises(TimeoutError):
        f.get(timeout=0.01)
    threading.Timer(0.02, f._set_result, args=(7,)).start()
    assert f.get(timeout=5) == 7

    async def main():
        g: Future = Future()
        asyncio.get_running_loop().call_later(0.01, g._set_result, 3)
        return await g

    assert asyncio.run(main()) == 3


def test_gather_fails_with_first_error():
    a, b = Future(), Future()
    out = gather_futures([a, b], list)
    b._set_exception(KeyError("b"))
    with pytest.raises(KeyError):
        out.get(timeout=1)
    x, y = Future(), Future()
    total = gather_futures([x, y], sum)
    x._set_result(2)
    assert not total.done()
    y._set_result(3)
    assert total.get(timeout=1) == 5
    assert gather_futures([], list).get() == []


def test_endpoint_decorator_validates():
    with pytest.raises(TypeError, match="without parentheses"):
        rm.endpoint()
    with pytest.raises(TypeError, match="plain instance methods"):
        rm.endpoint(property(lambda s: 1))

    class Base(rm.Actor):
        @rm.endpoint
        def a(self):
            ...

    class Child(Base):
        @rm.endpoint
        async def b(self):
            ...

        def private(self):
            ...

    assert endpoint_names(Child) == ("a", "b")
    with pytest.raises(TypeError, match="subclass of rm.Actor"):
        validate_actor_class(object)
    with pytest.raises(TypeError, match="no @rm.endpoint"):
        validate_actor_class(type("Empty", (rm.Actor,), {}))


def test_restart_policy_validation():
    assert rm.Restart(-1).allows(10**6)
    assert not rm.Restart(0).allows(0)
    assert rm.Restart(2).allows(1) and not rm.Restart(2).allows(2)
    with pytest.raises(ValueError, match="max_restarts"):
        rm.Restart(-2)


def test_local_kv_blocking_get():
    kv = LocalKV()
    with pytest.raises(KeyError):
        kv.get("x", timeout=0.01)
    threading.Timer(0.02, kv.put, args=("x", 1)).start()
    t0 = time.monotonic()
    assert kv.get("x", timeout=5) == 1 and time.monotonic() - t0 < 4
    assert kv.keys("x") == ["x"]


def test_context_outside_actor_raises():
    with pytest.raises(RuntimeError, match="only available inside an actor"):
        rm.context()


def test_import_rlmesh_is_light():
    import subprocess
    import sys

    code = "import sys, rlmesh; print(any(m in sys.modules for m in ('torch', 'duckdb', 'kubernetes')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_endpoint_is_made_once_per_handle_and_never_pickled_with_it():
    """``mesh.<name>`` keeps its Endpoint on the handle (no ``__getattr__`` on later reads); a copy of the
    handle (pickled to another process, or a slice) makes its own, over its own points."""
    import pickle

    from rlmesh.actor.mesh import ActorMesh, ActorPoint

    points = [ActorPoint(f"a{i}", f"p{i}", f"addr{i}", 0) for i in range(2)]
    mesh = ActorMesh("m", "Echo", ("ping",), points, Shape({"procs": 2}))
    ep = mesh.ping
    assert mesh.ping is ep and ep._mesh is mesh and ep._name == "ping"
    assert ep.options(timeout=1.0) is not ep and mesh.ping._timeout is None  # options() copies
    copy = pickle.loads(pickle.dumps(mesh))
    assert "ping" not in copy.__dict__ and copy.ping is not ep and copy.ping._mesh is copy
    one = mesh.slice(procs=1)
    assert one.ping._mesh is one and one.proc_ids == ["p1"]
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        mesh.nope  # noqa: B018 (the attribute read is what raises)
    assert "nope" not in mesh.__dict__
