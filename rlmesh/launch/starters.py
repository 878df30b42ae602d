"""This controller's start-up templates: the warm processes that first launches of local procs fork from.

Why a module apart from the launcher: a template is an interpreter importing the worker runtime
(~0.15 s of CPU), and the controller imports its own side of the runtime (~0.1 s) before it can
launch anything. Started by :func:`rlmesh.launch.this_host` before that import, the two run side
by side on two cores instead of one after the other. So this module imports only the
controller's side of :mod:`rlmesh.launch.forkserver` (the standard library) and the plugin hints
``import rlmesh`` already loaded, never the controller.

Templates are shared by every ``LocalLauncher`` of the process and keyed by interpreter and
environment: a launch whose environment differs (``spawn_procs(env=...)``, a changed ``sys.path``)
starts its own, and an unused one is stopped with the others when the controller shuts down.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from typing import Callable

from rlmesh import settings
from rlmesh.actor.hooks import worker_module_hints
from rlmesh.launch import forkserver
from rlmesh.launch.forkserver import ForkServer

logger = logging.getLogger(__name__)

STARTERS: dict[str, ForkServer] = {}
"""Key (interpreter and environment) -> start-up template, for every launcher of this process."""
STARTERS_LOCK = threading.Lock()
SET_BY_IMPORTS = frozenset({"TORCHINDUCTOR_CACHE_DIR", "PYGAME_HIDE_SUPPORT_PROMPT"})
"""Variables that importing a recipe's modules sets in the importing process itself (torch: its
inductor cache; gymnasium: pygame's banner), to the same value in the template: a controller that
imported them after its template started must still find that template."""
CHANGED_PER_CALL = frozenset({"PYTEST_CURRENT_TEST"})
"""Variables that change while the controller runs and that no import reads: pytest names the
running test in ``PYTEST_CURRENT_TEST``, so with it in the key every test of a user's suite started
(and left idling) a template of its own, importing torch again: ~1.8 s per test on 2 cores. Each
fork still gets the variable's value of its own launch (the request carries the full environment)."""


TORCH_HEAVY = ("numpy", "torch", "torch._dynamo")
"""What a proc that uses torch imports: ``torch._dynamo`` too (~1.2 s of CPU), which building a
``torch.optim`` optimiser imports lazily. The template imports it, so a trainer and its restarts
do not pay it; the controller, which builds no optimiser, never imports it."""


def controller_heavy() -> tuple[str, ...]:
    """Heavy modules the start-up template imports because this controller did: a controller that
    imported torch (an RL recipe) starts procs that import it too, and ~4 s of CPU each is paid once."""
    return TORCH_HEAVY if "torch" in sys.modules else ()


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a local worker gets: the controller's, plus ``extra``, with ``PYTHONPATH`` set
    to the controller's ``sys.path`` (so classes from the user's modules and test files import the
    same way in the worker)."""
    env = dict(os.environ)
    env.update(extra or {})
    paths = [p or os.getcwd() for p in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def key(python: str, env: dict[str, str]) -> str:
    """Which template serves ``env``: rlmesh's own variables (the run's telemetry address, the job
    secret) are read at run time, not import time, so they may differ from the template's."""
    return hashlib.sha1(repr((python, sorted((k, v) for k, v in env.items()
                                             if not k.startswith(settings.PREFIX) and k not in SET_BY_IMPORTS
                                             and k not in CHANGED_PER_CALL))
                             ).encode()).hexdigest()


def starter(python: str, env: dict[str, str], preload: tuple[str, ...] = (),
            on_exit: Callable[[], None] | None = None) -> ForkServer | None:
    """The running template for ``(python, env)``, started (importing ``preload`` too, and what
    :func:`controller_heavy` says) if there is none; None when templates cannot work here (one never
    started: procs start Python afresh).

    ``on_exit``: what the template calls when a child's exit is reported (the controller's wake-up);
    a template started before the controller existed gets it from its first launch.
    """
    k = key(python, env)
    with STARTERS_LOCK:
        srv = STARTERS.get(k)
        if srv is not None and not srv.dead:
            if srv.on_exit is None:
                srv.on_exit = on_exit
            return srv
        if srv is not None and not srv.ready.is_set():  # it never worked: do not start it again
            if not srv.warned:
                srv.warned = True
                logger.warning("the start-up template could not start; procs start Python afresh")
            return None
        if srv is not None:  # it served, then died (killed): a new one takes its place
            logger.warning("the start-up template died; starting a new one")
        try:
            srv = STARTERS[k] = ForkServer(
                python, env, os.getcwd(),
                (*forkserver.STARTER_PRELOAD, *dict.fromkeys((*worker_module_hints(), *preload, *controller_heavy()))),
                name=f"starter{len(STARTERS)}", on_exit=on_exit)
        except Exception:  # noqa: BLE001 - procs still start the plain way
            logger.warning("could not start the start-up template; procs start Python afresh", exc_info=True)
            return None
        return srv


def running(python: str, env: dict[str, str]) -> ForkServer | None:
    """The template for ``(python, env)`` if one runs (ready or still importing), without starting one:
    what a mesh's restart template forks from (:class:`~rlmesh.launch.forkserver.ForkServer` ``parent``)."""
    with STARTERS_LOCK:
        srv = STARTERS.get(key(python, env))
    return srv if srv is not None and not srv.dead else None


def start_early() -> None:
    """Start the template for this controller's default environment now, if none runs yet.

    When: from :func:`rlmesh.launch.this_host`, before the controller's runtime is imported, on the
    main thread only. The template dies when the thread that started it ends (``PR_SET_PDEATHSIG``),
    and the main thread lasts as long as the program; ``spawn_procs`` from another thread starts
    its template on the controller's supervisor thread, as before.
    """
    if not forkserver.enabled_by_env() or threading.current_thread() is not threading.main_thread():
        return
    starter(sys.executable, worker_env())


def close_all() -> None:
    """Stop every start-up template of this process (the controller shuts down)."""
    with STARTERS_LOCK:
        srvs = list(STARTERS.values())
        STARTERS.clear()
    for srv in srvs:
        srv.close()
