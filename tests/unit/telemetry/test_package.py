"""Submodule names must never shadow the package's public functions (``import x.query`` would)."""

import importlib
import pkgutil

import rlmesh.telemetry as tm


def test_public_functions_survive_importing_every_submodule():
    for mod in pkgutil.iter_modules(tm.__path__):
        importlib.import_module(f"rlmesh.telemetry.{mod.name}")
    for name in ("record", "record_batch", "query", "tables", "flush", "current_run", "start_run",
                 "set_config", "end_run"):
        assert callable(getattr(tm, name)), name
