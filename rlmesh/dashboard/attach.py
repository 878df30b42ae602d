"""What watches a recipe run: the dashboard (``telemetry.dashboard=true``) and the curve export
(``telemetry.export=tensorboard,wandb``), started by ``rlmesh run`` around the recipe's program.

Why a separate process for the dashboard: serving pages must not take the controller's
interpreter (its GIL runs the training loop); the dashboard is ``rlmesh dashboard RUN`` in a
child process that stops when the controller does, and every query it makes goes to the run's
telemetry service like any other reader. The exporter is a thread in the controller that
polls a few rows every two seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import rlmesh as rm
from rlmesh.dashboard.auth import DASHBOARD_JSON, TOKEN_ENV, new_token
from rlmesh.telemetry.api import current_run_dir
from rlmesh.telemetry.export import start_export
from rlmesh.telemetry.run import read_json

logger = logging.getLogger(__name__)

URL_WAIT_S = 60.0
"""How long ``rlmesh run`` waits for the dashboard to report its URL (a loaded machine imports slowly)."""


def start_dashboard(run_dir: Path, port: int = 0) -> tuple[subprocess.Popen, str | None]:
    """``rlmesh dashboard <run>`` as a child that exits with this process; returns it and its URL."""
    env = dict(os.environ, **{TOKEN_ENV: new_token()})  # the token travels in the environment, not in `ps`
    (run_dir / DASHBOARD_JSON).unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "rlmesh.cli", "dashboard", run_dir.name, "--port", str(port),
                             "--runs-dir", str(run_dir.parent), "--exit-with-pid", str(os.getpid())],
                            env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + URL_WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        info = read_json(run_dir / DASHBOARD_JSON)
        if info and info.get("pid") == proc.pid:
            return proc, str(info["url"])
        time.sleep(0.1)
    logger.warning("the dashboard did not report its URL within %.0f s (exit status %s); the run goes on without it",
                   URL_WAIT_S, proc.poll())
    return proc, None


@contextlib.contextmanager
def watching(cfg: Any) -> Iterator[None]:
    """Around a recipe's ``main``: start its run early, then the dashboard and/or export it asks for."""
    tel = getattr(cfg, "telemetry", None)
    targets = tel.export_targets() if tel is not None and hasattr(tel, "export_targets") else []
    if tel is None or not tel.enabled or not (tel.dashboard or targets):
        yield
        return
    tel.apply()
    resume = getattr(getattr(cfg, "run", None), "resume", None)
    run_id = rm.telemetry.start_run(config=cfg, run_id=resume or None, resume=bool(resume))  # begin() finds it started
    run_dir = current_run_dir()
    assert run_dir is not None and run_id is not None
    dash = None
    if tel.dashboard:
        dash, url = start_dashboard(run_dir, tel.dashboard_port)
        if url:
            print(f"dashboard: {url}", flush=True)
    exporter = start_export(targets, run_dir, run_id, config=None)
    try:
        yield
    finally:
        if exporter is not None:
            try:
                rm.telemetry.flush()
                exporter.stop()
                print(f"curves exported ({', '.join(targets)}): {exporter.exported} scalars"
                      + (f", tensorboard --logdir {run_dir.parent}" if "tensorboard" in targets else ""), flush=True)
            except Exception:  # noqa: BLE001 - the run's own result matters more than its mirror
                logger.warning("telemetry export: the final rows could not be exported", exc_info=True)
        if dash is not None and dash.poll() is None:
            dash.terminate()
            try:
                dash.wait(10)
            except subprocess.TimeoutExpired:
                dash.kill()
                dash.wait()
        if dash is not None:
            (run_dir / DASHBOARD_JSON).unlink(missing_ok=True)  # uvicorn re-raises SIGTERM before cleaning up
