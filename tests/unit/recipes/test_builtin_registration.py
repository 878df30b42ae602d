"""Built-in algorithms register through the plugin hook, found by walking a package, never a list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rlmesh.rl.algorithms as algorithms
from rlmesh.rl.algorithms.configs import builtin_modules


class _Recorder:
    """Collects what ``register(cs)`` stores (the ConfigStore's ``store`` signature)."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], Any] = {}

    def store(self, *, group: str, name: str, node: Any, package: str | None = None) -> None:
        self.stored[(group, name)] = node


def test_every_builtin_config_module_registers_its_algorithm() -> None:
    cs = _Recorder()
    for module in builtin_modules():
        module.register(cs)
    trainers = {name for group, name in cs.stored if group == "trainer"}
    assert {"ppo", "grpo", "a2c", "dqn", "rloo", "dapo"} <= trainers
    assert ("buffer", "transitions") in cs.stored


def test_every_algorithm_module_has_a_registered_trainer_config() -> None:
    """A new ``rl/algorithms/<name>.py`` needs a config module whose hook stores ``trainer/<name>`` with a
    ``_target_`` inside it: nothing else is edited, and nothing is forgotten."""
    cs = _Recorder()
    for module in builtin_modules():
        module.register(cs)
    targets = {name: getattr(node, "_target_", "") for (group, name), node in cs.stored.items() if group == "trainer"}
    folder = Path(algorithms.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        assert path.stem in targets, f"rl/algorithms/{path.name} has no rl/algorithms/configs/{path.name} storing trainer/{path.stem}"
        assert targets[path.stem].startswith(f"rlmesh.rl.algorithms.{path.stem}."), (path.stem, targets[path.stem])
