"""Roles.stop_order: callers first, then what they call; a shared proc goes with its last role."""

from dataclasses import dataclass

from rlmesh.recipes.loop import Roles


@dataclass
class Mesh:  # stands in for an ActorMesh: only where its actors live matters here
    proc_ids: list[str]


def test_producers_first_then_trainer_and_buffer_then_what_they_call():
    roles = Roles(generators=Mesh(["rl.3", "rl.4"]), trainer=Mesh(["rl.1"]), buffer=Mesh(["rl.0"]),
                  evaluator=Mesh(["rl.0"]), others={"reward": Mesh(["rl.2"]), "env": Mesh(["rl.5"])})
    # rl.0 hosts the evaluator (a caller) and the buffer (called by generators): it stops with the buffer
    assert [sorted(g) for g in roles.stop_order()] == [["rl.3", "rl.4"], ["rl.0", "rl.1"], ["rl.2", "rl.5"]]


def test_a_proc_hosting_a_caller_and_a_callee_stops_last():
    roles = Roles(generators=Mesh(["rl.0"]), trainer=Mesh(["rl.1"]), buffer=Mesh(["rl.1"]),
                  evaluator=Mesh(["rl.0"]), others={"reward": Mesh(["rl.0"])})
    assert roles.stop_order() == [[], ["rl.1"], ["rl.0"]]
