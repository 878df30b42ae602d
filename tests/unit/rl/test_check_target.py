"""``check_target``: a recipe's ``_target_`` is checked before any proc starts, without running its
module, and the module is imported on a background thread that ``actor_class`` then waits for."""

import sys
import threading
from types import SimpleNamespace

import pytest

import rlmesh as rm
from rlmesh.rl.run.placement import actor_class, check_target

GATED = '''
import {gate}
assert {gate}.OPEN.wait(30)  # the import blocks here until the test opens the gate
import rlmesh as rm

class Gated(rm.Actor):
    @rm.endpoint
    def ping(self) -> str:
        return "pong"

NOT_AN_ACTOR = 1
'''


@pytest.fixture
def gated(tmp_path, monkeypatch, request):
    """A module whose import waits for an event the test sets: ``(module name, event)``."""
    name = f"ct_gated_{request.node.name.replace('[', '_').replace(']', '_')}"
    gate = f"{name}_gate"
    event = threading.Event()
    sys.modules[gate] = SimpleNamespace(OPEN=event)  # type: ignore[assignment]
    (tmp_path / f"{name}.py").write_text(GATED.format(gate=gate))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, event
    event.set()
    sys.modules.pop(gate, None)


def role(target: str) -> SimpleNamespace:
    return SimpleNamespace(_target_=target)


def test_a_valid_target_is_checked_without_running_its_module_and_imported_meanwhile(gated):
    module, gate = gated
    check_target(role(f"{module}.Gated"), "trainer")  # returns although the module's import cannot finish yet
    assert not gate.is_set()
    gate.set()
    cls = actor_class(role(f"{module}.Gated"), "trainer")  # waits for the background import
    assert issubclass(cls, rm.Actor) and cls.__module__ == module


def test_a_mistyped_module_fails_at_once_with_the_config_key():
    with pytest.raises(rm.ConfigError, match=r"generator._target_='no_such_pkg_x.Gen' cannot be imported"):
        check_target(role("no_such_pkg_x.Gen"), "generator")


def test_a_class_its_module_does_not_define_fails_at_once(gated):
    module, gate = gated
    gate.set()  # the source does not show the name: the module is imported now, to be sure, and says so
    with pytest.raises(rm.ConfigError, match=rf"trainer._target_='{module}.Gatd' cannot be imported \(AttributeError"):
        check_target(role(f"{module}.Gatd"), "trainer")


def test_a_name_that_is_no_actor_class_fails_when_the_recipe_spawns(gated):
    module, gate = gated
    check_target(role(f"{module}.NOT_AN_ACTOR"), "buffer")  # defined: the check cannot tell more without running it
    gate.set()
    with pytest.raises(rm.ConfigError, match="is not an actor class"):
        actor_class(role(f"{module}.NOT_AN_ACTOR"), "buffer")
