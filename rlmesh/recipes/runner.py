"""Running a composed recipe config as ``rlmesh run`` does: its exit status, and inside a sweep job
the links between the job's Hydra folder and the run (:mod:`rlmesh.recipes.sweep_links`)."""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from typing import Any

from rlmesh import settings
from rlmesh.errors import ActorError, ConfigError, quiet_storage_tracebacks, storage_problem
from rlmesh.launch.admission import admit
from rlmesh.recipes.compose import run_config
from rlmesh.recipes.run_state import end_interrupted, stop_on_sigterm
from rlmesh.recipes.sweep_links import link_job
from rlmesh.rl.run.resilience import RunFailed
from rlmesh.telemetry.api import finish_run
from rlmesh.telemetry.errors import TelemetryError


def run_composed(cfg: Any, launcher: str) -> int:
    """Run a validated config; the exit status of ``rlmesh run`` (0 done, 1 the run failed, 2 the config
    could not run). Inside a sweep job (``$RLMESH_HYDRA_JOB_DIR``), the job folder and the run point at
    each other whatever the outcome (:func:`rlmesh.recipes.sweep.link_job`)."""
    result, status, rc = None, "failed", 1
    dump_stacks_on_sigusr2()
    quiet_storage_tracebacks()  # a full disk: one line per process, not a traceback from every writer
    stop_on_sigterm()  # SIGTERM stops the run as Ctrl-C does: clean stop, final checkpoint, 'interrupted'
    try:
        admit_on_this_host(cfg, launcher)
        result = run_config(cfg, launcher)
        status, rc = "ok", 0
    except ConfigError as exc:  # found by the program before any proc started (an actor class that cannot import)
        print(f"config error: {exc}", file=sys.stderr)
        status, rc = "config error", 2
    except RunFailed as exc:
        finish_run("failed", str(exc).splitlines()[0] if str(exc) else "RunFailed")
        print(f"run failed: {exc}", file=sys.stderr)
    except KeyboardInterrupt as exc:
        status, rc = "interrupted", end_interrupted(exc)
    except Exception as exc:
        line = actionable(exc)
        if line is None:
            raise
        finish_run("failed", line)
        print(f"rlmesh run: {line}", file=sys.stderr)
    finally:
        if settings.HYDRA_JOB_DIR.is_set():
            link_job(settings.HYDRA_JOB_DIR.get(), status, getattr(result, "objective", None))
    return rc


SIZE_KEYS = ("generator.replicas", "reward.replicas", "env.replicas", "trainer.ranks")
"""The settings that size a recipe's meshes: the admission check names the largest."""


def admit_on_this_host(cfg: Any, launcher: str) -> None:
    """Refuse (:class:`ConfigError`, one line) a local run whose meshes need more procs than this host
    holds (:mod:`rlmesh.launch.admission`), before its run folder or first proc exists. Why here: every
    way a recipe starts (``rlmesh run``, ``resume=``, a sweep's jobs) comes through this function."""
    if launcher != "local" or not callable(getattr(cfg, "proc_meshes", None)):
        return
    needed = sum(cfg.proc_meshes().values())
    sizes = {}
    for key in SIZE_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section, None), name, None)
        if isinstance(value, int):
            sizes[key] = value
    key = max(sizes, key=lambda k: sizes[k]) if sizes else "the recipe"
    what = f"{key}={sizes[key]}" if sizes else "the recipe"
    admit(needed, what, f"lower {key}" if sizes else "use smaller meshes")


def actionable(exc: BaseException) -> str | None:
    """One line for an error whose fix is the operator's (a full or read-only disk, a refused
    checkpoint, a run that cannot be resumed), printed instead of its traceback; None for the rest."""
    problem = storage_problem(exc)
    if problem is not None:
        return str(problem)
    if isinstance(exc, TelemetryError):
        return str(exc)
    if isinstance(exc, ActorError) and exc.remote_type.rsplit(".", 1)[-1] == "CheckpointError":
        return f"{exc.mesh}[{exc.rank}]: {exc.message}"  # the message says what to do with the file
    return None


def dump_stacks_on_sigusr2() -> None:
    """``kill -USR2 <pid of rlmesh run>`` prints every thread's Python stack of the controller on its
    stderr, as workers' stacks reach ``rlmesh stacks``: the way to see where a controller that does
    not stop (or does not progress) is. faulthandler writes from its C handler, so this works even
    while a thread holds the GIL. Not in a sweep job's thread (the handler is per process). A fatal
    signal (SIGSEGV, SIGABRT) prints the same stacks before the controller dies.

    Once per process: sweep jobs run one after another in the same one, and a second
    ``signal.signal`` would replace faulthandler's handler, which ``register`` does not put back."""
    global _stacks_on_sigusr2
    if _stacks_on_sigusr2 or not hasattr(signal, "SIGUSR2") or sys.stderr is None:
        return
    try:
        # Why the fatal signals too: a `rlmesh run` once ended with SIGABRT after its summary (a C
        # library at exit) and said nothing else.
        if not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)
        signal.signal(signal.SIGUSR2, _print_tasks)  # chained after faulthandler's dump
        faulthandler.register(signal.SIGUSR2, all_threads=True, chain=True)
        _stacks_on_sigusr2 = True
    except (ValueError, RuntimeError, OSError):  # not the main thread, or no usable stderr (embedded use)
        pass


_stacks_on_sigusr2 = False


def _print_tasks(signum: int, frame: Any) -> None:
    """After the threads' stacks: each asyncio task of the controller's loop and where it waits (a
    thread stack shows only the loop's ``select``). Runs in the main thread once it runs Python."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    tasks = asyncio.all_tasks(loop)
    print(f"asyncio: {len(tasks)} task(s) of the controller's loop", file=sys.stderr)
    for task in tasks:
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()
