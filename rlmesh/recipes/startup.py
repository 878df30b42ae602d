"""What ``rlmesh run`` is doing before its first progress line, one line per phase.

Why: on a busy host the imports (torch, Hydra, DuckDB), the procs' start and the actors'
``__init__`` take a minute before the first ``[train]`` line, and a silent minute reads as a hang.
``rlmesh run`` prints ``[start] loading rlmesh ...`` before it imports anything heavy
(:mod:`rlmesh.cli`), then each phase here with the seconds since the process started:

    [start] loading rlmesh (torch, Hydra, DuckDB)
    [start] 0.8 s  composing recipe=ppo_cartpole
    [start] 1.3 s  running recipes/ppo.py
    [start] 1.8 s  run 20261207-100204-7833: starting 3 procs (local)
    [start] 4.0 s  creating the actors on the 3 procs (their classes import torch, each proc joins first)
    [start] 4.3 s  actors ready; training

(one run, niced, at a load of 4 on 2 cores). The procs' template starts first and imports torch
while this process imports Hydra and composes; the actor classes' modules (torch again) import on
a thread while the procs start (:func:`rlmesh.rl.run.placement.check_target`).

They follow the progress setting (``run.progress=false`` or ``RLMESH_PROGRESS=off``: none;
``RLMESH_PROGRESS=json``: ``{"startup": {"phase", "elapsed_s"}}`` lines), on stdout like the
progress lines.
"""

from __future__ import annotations

import json
import time

import psutil

from rlmesh.rl.run.report import progress_format


def elapsed_s() -> float:
    """Seconds since this process started (the interpreter's own start-up included)."""
    try:
        return max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:
        return 0.0


def say(phase: str, enabled: bool = True) -> None:
    """Print start-up phase ``phase`` now (see the module docstring)."""
    fmt = progress_format(enabled)
    if fmt == "off":
        return
    t = round(elapsed_s(), 1)
    print(json.dumps({"startup": {"phase": phase, "elapsed_s": t}}) if fmt == "json" else f"[start] {t:.1f} s  {phase}",
          flush=True)
