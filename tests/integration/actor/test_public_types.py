"""Every public type rlmesh hands to user code crosses a process: real serialization, real actor calls.

The list is not hand-kept: it walks the exported names of ``rlmesh``, ``rlmesh.actor``,
``rlmesh.errors``, ``rlmesh.weights``, ``rlmesh.telemetry``, and every public dataclass,
enum and exception defined under ``rlmesh.rl``, ``rlmesh.weights`` and
``rlmesh.telemetry``. A new type that cannot be built generically needs an entry in
``EXAMPLES`` (the test fails naming it), so none is skipped quietly.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
import types
import typing
from typing import Any

import pytest
import torch

import rlmesh as rm
from echo_actors import Echo
from rlmesh.errors import ActorDied, ActorError, CallTimeout
from rlmesh.transport import dumps, loads
from rlmesh.weights.stats import SyncStats, Version

pytestmark = pytest.mark.timeout(300)

EXPORTING = ["rlmesh.actor", "rlmesh.errors", "rlmesh.weights", "rlmesh.telemetry"]
WALKED = ["rlmesh.rl", "rlmesh.weights", "rlmesh.telemetry"]
# Handles onto live resources (sockets, processes, threads): they are used where they are
# made, never returned by an endpoint. Anything else must round-trip.
LIVE_HANDLES = {"Actor", "ActorMesh", "ProcMesh", "Future", "Endpoint", "Publisher", "Subscriber", "HostMesh",
                "LocalLauncher", "Shape", "ValueMesh",
                "Fetched"}  # a weight reader's in-process handover to its Subscriber (holds a release callback)

_TB = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError: boom\n'
EXAMPLES: dict[str, Any] = {
    "Version": lambda: Version(7, SyncStats(name="policy", version=7, transport="shm", bytes=10, seconds=0.1,
                                            reader="generator[0]")),
    "QPInfo": lambda: importlib.import_module("rlmesh.weights.rdma_plan").QPInfo(
        qpn=5, psn=7, lid=1, gid="fe80:0000:0000:0000:0000:0000:0000:0001", port=1, gid_index=0, mtu=5),
    "ActorError": lambda: ActorError("ValueError: boom", mesh="trainer", rank=1, endpoint="train",
                                     remote_type="builtins.ValueError", remote_traceback=_TB),
    "ActorDied": lambda: ActorDied("the proc died (killed by signal 9)", mesh="gen", rank=0, endpoint="rollout",
                                   exit_code=None, signal=9),
    "CallTimeout": lambda: CallTimeout("no reply within 1s", mesh="gen", rank=2, endpoint="rollout"),
}


def public_types() -> dict[str, type]:
    found: dict[str, type] = {}
    for name in rm._NAMES:
        v = getattr(rm, name)
        if inspect.isclass(v):
            found[name] = v
    for modname in EXPORTING:
        mod = importlib.import_module(modname)
        for name in getattr(mod, "__all__", ()):
            v = getattr(mod, name)
            if inspect.isclass(v):
                found[name] = v
    for pkg in WALKED:
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            try:
                mod = importlib.import_module(info.name)
            except ImportError:  # an optional dependency (vllm, pyverbs, ...) absent here
                continue
            for name, v in vars(mod).items():
                if (inspect.isclass(v) and v.__module__ == mod.__name__ and not name.startswith("_")
                        and (dataclasses.is_dataclass(v) or issubclass(v, (enum.Enum, BaseException)))):
                    found.setdefault(name, v)
    return {k: v for k, v in found.items() if k not in LIVE_HANDLES}


def _dummy(tp: Any, depth: int = 0) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _dummy(args[0], depth) if args else None
    if origin in (list, tuple, set, frozenset, dict) or tp in (list, tuple, set, frozenset, dict):
        return (origin or tp)()
    if origin is typing.Literal:
        return typing.get_args(tp)[0]
    for base, value in ((bool, True), (int, 3), (float, 0.5), (str, "x"), (bytes, b"x")):
        if tp is base:
            return value
    if tp is torch.Tensor:
        return torch.arange(4.0)
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return next(iter(tp))
    if inspect.isclass(tp) and dataclasses.is_dataclass(tp) and depth < 4:
        return build(tp, depth + 1)
    return 1


def _call_with_dummies(fn: Any, cls: type, depth: int) -> Any:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    kwargs = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        kwargs[p.name] = _dummy(hints.get(p.name, str), depth)
    return cls(**kwargs)


def build(cls: type, depth: int = 0) -> Any:
    if cls.__name__ in EXAMPLES:
        return EXAMPLES[cls.__name__]()
    if issubclass(cls, enum.Enum):
        return list(cls)
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        kwargs = {f.name: _dummy(hints.get(f.name, str), depth) for f in dataclasses.fields(cls)
                  if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        return cls(**kwargs)
    if issubclass(cls, BaseException):
        return _call_with_dummies(cls.__init__, cls, depth) if cls.__init__ is not BaseException.__init__ \
            else cls("boom")
    raise TypeError(f"no example for public type {cls.__module__}.{cls.__qualname__}: add one to EXAMPLES")


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, BaseException):
        return str(a) == str(b) and same(a.args, b.args) and same(_state(a), _state(b))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, int) and type(a) is not int and not isinstance(a, enum.Enum):  # Version & co
        return int(a) == int(b) and same(_state(a), _state(b))
    return a == b


def _state(obj: Any) -> dict:
    return {k: v for k, v in getattr(obj, "__dict__", {}).items() if k != "__traceback__"}


EXAMPLE_VALUES: dict[str, Any] = {}
TYPES = public_types()


def example(name: str) -> Any:
    if name not in EXAMPLE_VALUES:
        EXAMPLE_VALUES[name] = build(TYPES[name])
    return EXAMPLE_VALUES[name]


def test_the_walk_finds_the_types_users_get():
    for name in ("Version", "SyncStats", "PublishStats", "ActorError", "ActorDied", "CallTimeout", "Restart",
                 "TrainResult", "Rollout", "SchemaError", "ConfigError"):
        assert name in TYPES, f"{name} fell out of the public-types walk"
    assert len(TYPES) >= 40


@pytest.mark.parametrize("name", sorted(TYPES))
def test_every_public_type_survives_serialization(name):
    value = example(name)
    back = loads([bytes(f) for f in dumps(value)])
    assert same(value, back), f"{name} changed on its way through rlmesh.transport: {value!r} -> {back!r}"


def test_every_public_type_survives_a_real_actor_call():
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        broken = []
        for name in sorted(TYPES):
            value = example(name)
            for ep in (echo.echo, echo.echo_sync):
                try:
                    back = ep.call_one(value).get(timeout=60)
                except Exception as exc:  # noqa: BLE001 - collect every failure, report them together
                    broken.append(f"{name} via {ep}: {type(exc).__name__}: {exc}"[:400])
                    continue
                if not same(value, back):
                    broken.append(f"{name}: {value!r} came back as {back!r}")
        assert not broken, "\n".join(broken)


def test_version_from_an_endpoint_keeps_its_stats():
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        v = procs.spawn("echo", Echo).echo.call_one(example("Version")).get(timeout=60)
    assert isinstance(v, Version) and v == 7 and v.stats.transport == "shm"


@pytest.mark.parametrize("name", ["ActorError", "ActorDied", "CallTimeout", "ValueError"])
def test_errors_raised_in_an_actor_reach_the_caller_with_their_traceback(name):
    exc = ValueError("boom") if name == "ValueError" else example(name)
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        with pytest.raises(ActorError) as info:
            echo.raise_it.call_one(exc).get(timeout=60)
    err = info.value
    if isinstance(exc, ActorError):  # an actor re-raising a remote error keeps the innermost story
        assert type(err) is type(exc) and err.remote_traceback == exc.remote_traceback and err.rank == exc.rank
    else:
        assert err.endpoint == "raise_it" and "raise exc" in err.remote_traceback
        assert isinstance(err.exception, ValueError) and str(err.exception) == "boom"
