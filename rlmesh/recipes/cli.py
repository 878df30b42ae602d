"""``rlmesh run``: compose a recipe config with Hydra, validate it, run its controller program.

    rlmesh run recipe=ppo_cartpole trainer.lr=1e-4 generator.replicas=3
    rlmesh run -m recipe=ppo_cartpole trainer.lr=1e-3,2e-3 run.seed=0,1     # multirun sweep
    rlmesh run recipe=my_recipe hydra.searchpath=[file:///home/me/configs]   # your own configs
    rlmesh run recipe=ppo_cartpole --cfg job                                 # print the config, run nothing
    rlmesh run resume=latest                     # continue a run whose controller died (or resume=RUN_ID)
    rlmesh run recipe=ppo_cartpole faults=generator_kill                     # prove it survives (docs/faults.md)
    rlmesh run --help                            # Hydra's help: every config group and its options
    rlmesh run -m recipe=ppo_cartpole hydra/sweeper=optuna hydra.sweeper.n_trials=8 'trainer.lr=interval(1e-4,3e-3)'

Composition and validation live in :mod:`rlmesh.recipes.compose`; continuing a run in
:mod:`rlmesh.recipes.run_state`. A bad config is one ``config error:`` line naming the key and
the fix, exit status 2.
"""

from __future__ import annotations

import logging
import sys

from rlmesh import settings
from rlmesh.errors import ConfigError
from rlmesh.launch.local import prewarm

logger = logging.getLogger(__name__)


HYDRA_FLAGS = frozenset({"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p", "--package",
                         "-i", "--info", "-sc", "--shell-completion", "-cp", "--config-path", "-cn", "--config-name",
                         "-cd", "--config-dir", "-m", "--multirun", "-r", "--run", "--experimental-rerun"})
"""Hydra's own command-line flags: ``rlmesh run`` with any of them is Hydra's application, unchanged."""


def run_main(argv: list[str]) -> int:
    """Entry point of ``rlmesh run`` (see the module docstring).

    Three paths: ``resume=RUN`` rebuilds the saved config of that run; any of Hydra's flags
    (:data:`HYDRA_FLAGS`: ``--help``, ``--cfg``, ``--info``, ``-m``, shell completion, ...) runs
    ``rlmesh run`` as the Hydra application it is (:func:`rlmesh.recipes.sweep.hydra_app`); plain
    overrides compose with Hydra's compose API and run in this process (no Hydra output folder,
    no logging set-up: the fastest start)."""
    resume = next((a.split("=", 1)[1] for a in argv if a.startswith("resume=")), None)
    hydra = any(a.split("=", 1)[0] in HYDRA_FLAGS for a in argv)
    if resume is None and not hydra and local_without_workspace(argv):
        prewarm()  # first: the procs' template imports torch while this process imports Hydra and composes
    # Hydra and the run machinery (~0.3 s of CPU) only now, once the template has started
    from rlmesh.recipes.compose import RecipeConfigError, compose, quote_string_lists  # deferred: Hydra, see above
    from rlmesh.recipes.run_state import resume_config  # deferred: imports Hydra
    from rlmesh.recipes.runner import run_composed  # deferred: imports the run machinery and Hydra
    from rlmesh.recipes.startup import say  # deferred: imports rich
    from rlmesh.recipes.sweep import hydra_app  # deferred: imports Hydra

    if not {"-m", "--multirun"} & set(argv):  # `telemetry.export=tensorboard,wandb`: one string, not a sweep
        argv = quote_string_lists(argv)
    if hydra:
        return hydra_app(argv)
    logging.basicConfig(level=settings.LOG_LEVEL.get(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if resume is not None:  # the saved config of that run, with the other overrides on top
            _runs_dir_override(argv)
            cfg, launcher = resume_config(resume, argv)
        else:
            recipe = next((a.split("=", 1)[1] for a in argv if a.startswith("recipe=")), "ppo_cartpole")
            say(f"composing recipe={recipe}", "run.progress=false" not in argv)
            cfg, launcher = compose(argv)
    except (RecipeConfigError, ConfigError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    return run_composed(cfg, launcher)


def local_without_workspace(overrides: list[str]) -> bool:
    """True when the command line keeps the local launcher and leaves ``workspace.*`` alone: the run
    will most likely fork its procs on this host from a template whose environment is this one's.

    Why ask before composing: Hydra's compose and validation take ~0.45 s, and the procs' start-up
    template needs ~3 s of CPU to import torch; started first, it is ready that much sooner, and
    ``spawn_procs`` waited for it (1.2-1.4 s of a CartPole recipe's ~5 s of fixed cost). When the
    recipe's own YAML picks another launcher or turns the workspace sync on (which changes
    ``sys.path``, so the procs' environment), this template goes unused and is stopped at exit.
    """
    launcher = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+~").startswith("launcher=")), "local")
    return launcher == "local" and not any(o.lstrip("+~").startswith("workspace.") for o in overrides)


def _runs_dir_override(overrides: list[str]) -> None:
    """``telemetry.runs_dir=...`` next to ``resume=``: look for the run there."""
    for o in overrides:
        if o.startswith("telemetry.runs_dir="):
            settings.RUNS_DIR.set(o.split("=", 1)[1])
