"""Checked by mypy, never run: what a type checker sees through rlmesh's front door.

tests/unit/test_static_checks.py runs mypy over this file with the project's configuration
(pyproject.toml, which enables the plugin ``rlmesh.actor.mypy_plugin``). Each ``assert_type`` is a
claim about the public API's types; a wrong one fails the check. The ``# type: ignore[...]`` lines
are claims too: with ``warn_unused_ignores``, a call that stopped being an error fails it.
"""

from __future__ import annotations

from typing import Any, assert_type

import rlmesh as rm
from rlmesh.actor.mesh import Endpoint, Stream


class Scorer(rm.Actor):
    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    @rm.endpoint
    async def score(self, text: str) -> float:
        return self.scale * len(text)

    @rm.endpoint
    def count(self, *, upto: int = 3) -> list[int]:
        return list(range(upto))

    def helper(self) -> int:  # not an endpoint
        return 1

    async def inside(self) -> float:
        # Inside the actor an endpoint is the plain method it was written as.
        assert_type(self.count(upto=2), list[int])
        return await self.score("abc")


class LoudScorer(Scorer):  # endpoints are inherited
    @rm.endpoint
    def shout(self, text: str) -> str:
        return text.upper()


def calls(procs: rm.ProcMesh) -> None:
    mesh = procs.spawn("scorer", Scorer, scale=0.5)
    assert_type(mesh, rm.ActorMesh[Scorer])
    # The parameters keep their names (text: str), which assert_type cannot spell: assignments instead.
    score: Endpoint[[str], float] = mesh.score  # noqa: F841 (mypy checks the assignment)
    wrong: Endpoint[[int], float] = mesh.score  # type: ignore[assignment]  # noqa: F841
    assert_type(mesh.score.call_one("x").get(), float)
    assert_type(mesh.score.choose("x").get(timeout=1.0), float)
    assert_type(mesh.score.call("x").get(), rm.ValueMesh[float])
    assert_type(mesh.score.call("x").get()[0], float)
    assert_type(mesh.score.stream("x"), Stream[float])
    assert_type(mesh.score.broadcast("x"), None)
    assert_type(mesh.score.options(timeout=2.0).call_one("x"), rm.Future[float])
    assert_type(mesh.count.call_one(upto=4).get(), list[int])
    assert_type(mesh.slice(procs=0), rm.ActorMesh[Scorer])
    assert_type(mesh.shape, dict[str, int])
    assert_type(mesh.name, str)

    mesh.score.call_one(3)  # type: ignore[arg-type]
    mesh.count.call_one(4)  # type: ignore[call-arg]
    mesh.helper.call_one()  # type: ignore[attr-defined]

    loud = procs.spawn("loud", LoudScorer)
    assert_type(loud.shout.call_one("x").get(), str)
    assert_type(loud.score.call_one("x").get(), float)

    untyped: rm.ActorMesh[Any] = mesh
    assert_type(untyped.anything, Endpoint[..., Any])


async def awaits(mesh: rm.ActorMesh[Scorer]) -> None:
    assert_type(await mesh.score.call_one("x"), float)
    assert_type(await mesh.score.call("x"), rm.ValueMesh[float])
    async for value in mesh.score.stream("x"):
        assert_type(value, float)
    for value in mesh.score.stream("x"):
        assert_type(value, float)
