"""The ``rlmesh`` command. Each subcommand lives with the layer it belongs to and is imported only when used."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from typing import NoReturn

from rlmesh import settings

# subcommand -> ("module:function", one-line help). Each function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("rlmesh.recipes.cli:run_main", "run a recipe: rlmesh run recipe=ppo_cartpole trainer.lr=3e-4"),
    "sql": ("rlmesh.telemetry.cli:sql_main", 'query a run: rlmesh sql [RUN] "SELECT ..."'),
    "runs": ("rlmesh.telemetry.cli:runs_main", "list runs"),
    "plot": ("rlmesh.telemetry.plot:plot_main", "render reward and loss curves of a run to PNG"),
    "dashboard": ("rlmesh.dashboard.server:dashboard_main", "live web pages over the runs: rlmesh dashboard [RUN]"),
    "k8s": ("rlmesh.recipes.k8s:k8s_main", "render or clean up Kubernetes objects"),
    "clean": ("rlmesh.weights.clean:clean_main", "reclaim /dev/shm segments and run records left by dead runs"),
    "logs": ("rlmesh.telemetry.logs_cli:logs_main", "a run's output and log records: rlmesh logs [RUN] --level WARNING"),
    "stacks": ("rlmesh.telemetry.logs_cli:stacks_main", "every thread's Python stack of a live run's procs"),
    "mcp": ("rlmesh.agents.mcp_server:mcp_main", "MCP server (stdio) over runs, for AI agents"),
    "debug": ("rlmesh.agents.debug_cli:debug_main", "list actors paused at breakpoint(); attach pdb to one"),
}


def _usage() -> str:
    lines = ["usage: rlmesh <command> [args]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-sc", "--shell-completion"):  # Hydra's completion script asks the program, not `rlmesh run`
        argv = ["run", *argv]
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rlmesh: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if name == "run":
        _say_loading(rest)
    spec = COMMANDS[name][0]
    mod, _, fn = spec.partition(":")
    try:
        func = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as exc:
        print(f"rlmesh {name}: not available in this install ({exc})", file=sys.stderr)
        return 2
    return int(func(rest) or 0)


def _say_loading(argv: list[str]) -> None:
    """A plain ``rlmesh run`` says what it does before it imports torch and Hydra (seconds; a minute
    with its procs' start on a busy host): the first of rlmesh.recipes.startup's ``[start]`` lines."""
    if any(a.startswith("-") for a in argv) or "run.progress=false" in argv:  # Hydra's flags print their own
        return
    fmt = settings.PROGRESS.get()
    if fmt != "off":
        phase = "loading rlmesh (torch, Hydra, DuckDB)"
        print(f'{{"startup": {{"phase": "{phase}", "elapsed_s": null}}}}' if fmt == "json" else f"[start] {phase}",
              flush=True)


def console_main() -> NoReturn:
    """The ``rlmesh`` console script (and ``python -m rlmesh.cli``): :func:`main`, then :func:`exit_now`.
    An exception from :func:`main` takes Python's normal exit instead (its traceback, then teardown)."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` as Python's normal exit does, minus the interpreter's teardown of its modules.

    Why: a process that imported torch spends ~0.6 s tearing its modules down after all its work is done
    (``python -c "import torch, duckdb, pyarrow, gymnasium, numpy, omegaconf"`` exits in 1.95 s here, 1.33 s
    through ``os._exit``), and ``rlmesh run`` paid that after its summary was printed: ~9 % of a whole
    ``ppo_cartpole`` process. What a normal exit does that anything relies on still happens, in its
    order: threading's exit hooks run and the other non-daemon threads are waited for (``threading._shutdown``,
    as the interpreter calls it: executors such as joblib's stop their threads from those hooks, so a
    join without them waits forever), the atexit handlers run (logging's shutdown, finalizers such as
    temporary directories', rlmesh's own stops), then stdout and stderr are flushed.
    When: only at the end of the console script, never inside :func:`main`, which tests and notebooks call.
    """
    threading._shutdown()  # type: ignore[attr-defined]  # private, on purpose  # what the interpreter runs first: threading's own exit hooks, then the joins
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    console_main()
