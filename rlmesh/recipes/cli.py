"""``rlmesh run``: compose a recipe config with Hydra, validate it, run its controller program.

    rlmesh run recipe=ppo_cartpole trainer.lr=1e-4 generator.replicas=3
    rlmesh run -m recipe=ppo_cartpole trainer.lr=1e-3,2e-3 run.seed=0,1     # multirun sweep
    rlmesh run recipe=my_recipe hydra.searchpath=[file:///home/me/configs]   # your own configs
    rlmesh run recipe=ppo_cartpole --cfg job                                 # print the config, run nothing
    rlmesh run resume=latest                     # continue a run whose controller died (or resume=RUN_ID)
    rlmesh run recipe=ppo_cartpole faults=generator_kill                     # prove it survives (docs/faults.md)

Composition and validation live in :mod:`rlmesh.recipes.compose`; continuing a run in
:mod:`rlmesh.recipes.run_state`. A bad config is one ``config error:`` line naming the key and
the fix, exit status 2.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

from rlmesh.errors import ConfigError
from rlmesh.recipes.compose import RecipeConfigError, compose, config_dir, run_config, validate
from rlmesh.recipes.config_store import register

logger = logging.getLogger(__name__)


def _multirun(overrides: list[str]) -> int:
    """``-m``: Hydra's sweeper expands the overrides; each job is validated, then run as its own
    ``rlmesh run`` process, so every job gets a fresh controller, its own procs and its own
    telemetry run (and one failing job does not take the sweep down)."""
    import hydra  # hydra.main builds its own app machinery (sweeper, launcher): only a sweep pays for it
    from hydra.core.hydra_config import HydraConfig

    register()
    failures: list[str] = []

    @hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
    def job(cfg: Any) -> None:
        task_overrides = list(HydraConfig.get().overrides.task)
        try:
            validate(cfg)
        except RecipeConfigError as exc:
            failures.append(str(exc))
            print(f"config error: {exc}", file=sys.stderr)
            return
        print(f"[multirun job {HydraConfig.get().job.num}] rlmesh run {' '.join(task_overrides)}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "rlmesh.cli", "run", *task_overrides])
        if rc:
            failures.append(f"job {task_overrides} exited with {rc}")

    saved = sys.argv
    sys.argv = ["rlmesh run", "-m", *overrides]
    try:
        job()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = saved
    return 2 if failures else 0


def run_main(argv: list[str]) -> int:
    """Entry point of ``rlmesh run`` (see the module docstring)."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    if any(a in ("-m", "--multirun") for a in argv):
        return _multirun([a for a in argv if a not in ("-m", "--multirun")])
    show = "--cfg" in argv
    overrides = [a for a in argv if a not in ("--cfg", "job")]
    logging.basicConfig(level=os.environ.get("RLMESH_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    resume = next((a.split("=", 1)[1] for a in overrides if a.startswith("resume=")), None)
    try:
        if resume is not None:  # the saved config of that run, with the other overrides on top
            from rlmesh.recipes.run_state import resume_config

            _runs_dir_override(overrides)
            cfg, launcher = resume_config(resume, overrides)
        else:
            cfg, launcher = compose(overrides)
    except RecipeConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if show:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        return 0
    from rlmesh.rl.resilience import RunFailed

    try:
        run_config(cfg, launcher)
    except ConfigError as exc:  # found by the program before any proc started (an actor class that cannot import)
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        import rlmesh as rm

        rm.telemetry.end_run("failed")
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _runs_dir_override(overrides: list[str]) -> None:
    """``telemetry.runs_dir=...`` next to ``resume=``: look for the run there."""
    for o in overrides:
        if o.startswith("telemetry.runs_dir="):
            os.environ["RLMESH_RUNS_DIR"] = o.split("=", 1)[1]
