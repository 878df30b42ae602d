"""``rlmesh run`` as the Hydra application it is: help, info, config printing, shell completion and sweeps.

Any of Hydra's own flags sends ``rlmesh run`` here (:func:`hydra_app`), to ``@hydra.main`` unchanged:
``--help`` lists every config group and its options (ours and a plugin's), ``--info``, ``--cfg
job|hydra|all`` (``-c``), ``--resolve``, ``--shell-completion install=bash``, and ``-m`` with any sweeper
or launcher (``hydra/sweeper=optuna``, ``hydra/launcher=joblib``).

A sweep (``-m``) runs each job's recipe as its own ``rlmesh run`` process (a fresh controller, its own
procs and telemetry run; one failing job does not take the sweep down) with the job's overrides, its
``hydra.searchpath`` included, and returns the run's **objective** (its final evaluation) to the sweeper,
so ``hydra/sweeper=optuna`` optimises it (``NaN`` for a failed job: Optuna records a failed trial).
Jobs report to the parent through files (they may run in other processes, as with joblib), so after
any launcher the parent knows every job's outcome: it prints one table (overrides -> final eval),
writes ``<sweep dir>/telemetry.duckdb`` (tables ``jobs`` and ``evals`` across the runs, view
``summary``: ``rlmesh sql <sweep dir> "SELECT * FROM summary"``), and exits non-zero if any job failed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from rlmesh import settings
from rlmesh.errors import ConfigError
from rlmesh.files import write_atomically
from rlmesh.recipes.compose import RecipeConfigError, compose, config_dir, explain, preset_overrides, validate
from rlmesh.recipes.config_store import register
from rlmesh.recipes.runner import run_composed
from rlmesh.recipes.sweep_links import JOB_DIR_ENV, read_run_link
from rlmesh.telemetry.run import DB_NAME

STATUS_DIR_ENV = settings.SWEEP_STATUS_DIR.name
"""Where sweep jobs leave ``<job num>.json`` for the parent (set by :func:`hydra_app`)."""


def hydra_app(argv: list[str]) -> int:
    """``rlmesh run`` with Hydra's flags: run ``@hydra.main``; after a sweep, summarise its jobs. Returns the exit status."""
    try:
        register()
    except ConfigError as exc:  # a plugin that does not load
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    status_dir = tempfile.mkdtemp(prefix="rlmesh-sweep-")
    settings.SWEEP_STATUS_DIR.set(status_dir)  # before the launcher starts workers: they inherit it
    _completion_line_without_run()
    overrides = hydra_overrides(argv)
    if overrides is not None:  # --cfg/--resolve/--run: a config that cannot run is refused as without the flags
        try:
            compose(overrides)
            chosen = preset_overrides(overrides)  # recipe=ppo generator.env_id=X: print the preset's config
        except RecipeConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            return 2
        swap = dict(zip(overrides, chosen))
        argv = [swap.get(a, a) for a in argv]
    app = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(task)
    saved, sys.argv = sys.argv, ["rlmesh", *argv]
    own_errors = "HYDRA_FULL_ERROR" not in os.environ  # else the user asked for Hydra's traceback
    if own_errors:  # Hydra then raises its errors (instead of printing them and exiting 1): one line, exit 2
        os.environ["HYDRA_FULL_ERROR"] = "1"
    rc = 0
    try:
        app()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (HydraException, OmegaConfBaseException) as exc:  # a sweep's composition: unknown key, preset, value
        if not own_errors:
            raise
        print(f"config error: {explain(exc, [a for a in argv if '=' in a and not a.startswith('-')])}",
              file=sys.stderr)
        rc = 2
    finally:
        sys.argv = saved
        if own_errors:
            os.environ.pop("HYDRA_FULL_ERROR", None)
    jobs = _read_jobs(Path(status_dir))
    if jobs:
        summarise(jobs)
        failed = [j for j in jobs if j["status"] != "ok"]
        if failed:
            rc = rc or (2 if all(j["status"] == "config error" for j in failed) else 1)
            print(f"{len(failed)} of {len(jobs)} sweep jobs failed", file=sys.stderr)
    return rc


_VALUE_FLAGS = frozenset({"-c", "--cfg", "-p", "--package"})
_CHECKED_FLAGS = _VALUE_FLAGS | {"--resolve", "-r", "--run"}


def hydra_overrides(argv: list[str]) -> list[str] | None:
    """The overrides of a command line whose Hydra flags only print or run one config (``-c job``,
    ``--resolve``, ``-p trainer``, ``--run``): those :func:`hydra_app` composes and validates first, as
    ``rlmesh run`` without the flags does. ``None`` for any other flag (``-m``, ``--help``, ``--info``, ...)."""
    overrides, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in _VALUE_FLAGS:
            skip = True
        elif a.startswith("-"):
            if a.split("=", 1)[0] not in _CHECKED_FLAGS:
                return None
        else:
            overrides.append(a)
    return overrides


def task(cfg: Any) -> float:
    """Hydra's task function: one job. Returns the objective (NaN when the run produced none)."""
    hc = HydraConfig.get()
    job_dir = hc.runtime.output_dir
    launcher = str(hc.runtime.choices.get("launcher", "local"))
    if hc.mode != RunMode.MULTIRUN:  # `rlmesh run --run ...` (or another flag that still runs): in this process
        try:
            obj = validate(cfg)
        except RecipeConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            raise SystemExit(2) from exc
        settings.HYDRA_JOB_DIR.set(job_dir)
        rc = run_composed(obj, launcher)
        if rc:
            raise SystemExit(rc)
        return _objective(read_run_link(job_dir))
    overrides = list(hc.overrides.task) + [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath=")]
    record = {"job": int(hc.job.num), "overrides": " ".join(hc.overrides.task), "hydra_dir": job_dir}
    try:
        validate(cfg)
    except RecipeConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        _write_job(record | {"status": "config error", "exit_code": 2})
        return math.nan
    print(f"[sweep job {hc.job.num}] rlmesh run {' '.join(overrides)}", flush=True)
    rc = subprocess.call([sys.executable, "-m", "rlmesh.cli", "run", *overrides], env={**os.environ, JOB_DIR_ENV: job_dir})
    link = read_run_link(job_dir)
    status = "ok" if rc == 0 else (link.get("status") if link.get("status") not in (None, "ok") else f"exit {rc}")
    _write_job(record | link | {"status": status, "exit_code": rc})
    return _objective(link) if rc == 0 else math.nan


def _objective(link: dict[str, Any]) -> float:
    value = link.get("objective")
    return float(value) if value is not None else math.nan


def _write_job(record: dict[str, Any]) -> None:
    path = Path(settings.SWEEP_STATUS_DIR.get()) / f"{record['job']:06d}.json"
    write_atomically(path, json.dumps(record))


def _read_jobs(status_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(status_dir.glob("*.json"))]


def _completion_line_without_run() -> None:
    """Shell completion runs ``rlmesh -sc query=bash`` with the whole line (``rlmesh run tra``): Hydra
    must see the line as if ``rlmesh run`` were one program, so the ``run`` word is taken out."""
    line = os.environ.get("COMP_LINE")
    if line is None:
        return
    head, sep, rest = line.partition(" run ")
    if sep and " " not in head.strip():
        os.environ["COMP_LINE"] = f"{head} {rest}"
        point = int(os.environ.get("COMP_POINT", len(line)))
        os.environ["COMP_POINT"] = str(max(point - len(" run"), len(head)))


def summarise(jobs: list[dict[str, Any]], console: Console | None = None) -> Path | None:
    """The sweep's table (overrides -> final eval) and its database; returns the database's path."""
    console = console or Console()
    split = [j["overrides"].split() for j in jobs]
    common = [o for o in split[0] if all(o in s for s in split[1:])] if len(jobs) > 1 else []
    table = Table(title="sweep", show_header=True)
    for col in ("job", "overrides" if not common else "overrides that vary", "status", "run", "final eval"):
        table.add_column(col, overflow="fold")  # an override is never cut short ("…"): it is what the sweep is about
    for j, s in zip(jobs, split):
        final = j.get("objective")
        table.add_row(str(j["job"]), " ".join(o for o in s if o not in common) or "-", j["status"],
                      j.get("run_id") or "-", "-" if final is None else f"{final:.4g}")
    if not console.is_terminal:  # piped to a file: as wide as the table needs, so no override wraps
        console = Console(file=console.file, width=max(80, Measurement.get(console, console.options.update_width(100_000), table).maximum))
    if common:
        console.print(f"every job: {' '.join(common)}", soft_wrap=True, markup=False, highlight=False)
    console.print(table)
    sweep_dir = Path(jobs[0]["hydra_dir"]).parent
    db = sweep_database(sweep_dir, jobs)
    console.print(f'Query this sweep: rlmesh sql {sweep_dir} "SELECT * FROM summary ORDER BY final_eval DESC"',
                  soft_wrap=True, markup=False, highlight=False)
    return db


def sweep_database(sweep_dir: Path, jobs: list[dict[str, Any]]) -> Path:
    """``<sweep dir>/telemetry.duckdb``: ``jobs`` (one row per job), ``evals`` (every run's evaluations with
    ``job`` and ``run_id``) and the view ``summary`` (each job's overrides, status and final evaluation)."""
    path = sweep_dir / DB_NAME
    path.unlink(missing_ok=True)
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE jobs (job INTEGER, overrides VARCHAR, status VARCHAR, exit_code INTEGER, "
                    "run_id VARCHAR, run_dir VARCHAR, hydra_dir VARCHAR, objective DOUBLE)")
        con.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [(j["job"], j["overrides"], j["status"], j.get("exit_code"), j.get("run_id"), j.get("run_dir"),
                          j["hydra_dir"], j.get("objective")) for j in jobs])
        have_evals = False
        for j in jobs:
            run_db = Path(j["run_dir"]) / DB_NAME if j.get("run_dir") else None
            if run_db is None or not run_db.exists():
                continue
            con.execute("ATTACH ? AS run (READ_ONLY)", [str(run_db)])
            try:
                select = f"SELECT {int(j['job'])} AS job, ? AS run_id, * EXCLUDE (run_id) FROM run.evals" \
                    if "run_id" in {r[0] for r in con.execute("DESCRIBE run.evals").fetchall()} else \
                    f"SELECT {int(j['job'])} AS job, ? AS run_id, * FROM run.evals"
                if have_evals:
                    con.execute(f"INSERT INTO evals BY NAME {select}", [j["run_id"]])
                else:
                    con.execute(f"CREATE TABLE evals AS {select}", [j["run_id"]])
                    have_evals = True
            except duckdb.CatalogException:  # a run that ended before its first evaluation has no evals table
                pass
            finally:
                con.execute("DETACH run")
        if not have_evals:
            con.execute("CREATE TABLE evals (job INTEGER, run_id VARCHAR, metric VARCHAR, value DOUBLE, "
                        "policy_version BIGINT, env_steps BIGINT)")
        con.execute("""CREATE VIEW summary AS
            SELECT j.job, j.overrides, j.status, j.run_id, j.objective AS final_eval, e.metric,
                   e.policy_version AS final_version, e.env_steps, j.hydra_dir, j.run_dir
            FROM jobs j LEFT JOIN (
                SELECT * FROM evals QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY policy_version DESC) = 1
            ) e USING (run_id) ORDER BY j.job""")
    return path
