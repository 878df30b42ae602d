"""The ``rlmesh`` command. Each subcommand lives with the layer it belongs to and is imported only when used."""

from __future__ import annotations

import importlib
import sys

# subcommand -> ("module:function", one-line help). Each function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("rlmesh.recipes.cli:run_main", "run a recipe: rlmesh run recipe=ppo_cartpole trainer.lr=3e-4"),
    "sql": ("rlmesh.telemetry.cli:sql_main", 'query a run: rlmesh sql [RUN] "SELECT ..."'),
    "runs": ("rlmesh.telemetry.cli:runs_main", "list runs"),
    "plot": ("rlmesh.telemetry.plot:plot_main", "render reward and loss curves of a run to PNG"),
    "k8s": ("rlmesh.recipes.k8s:k8s_main", "render or clean up Kubernetes objects"),
}


def _usage() -> str:
    lines = ["usage: rlmesh <command> [args]", "", "commands:"]
    lines += [f"  {name:<6} {help_}" for name, (_, help_) in COMMANDS.items()]
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
    spec = COMMANDS[name][0]
    mod, _, fn = spec.partition(":")
    try:
        func = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as exc:
        print(f"rlmesh {name}: not available in this install ({exc})", file=sys.stderr)
        return 2
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
