"""What ``rlmesh run`` is doing before its first progress line, one line per phase.

Why: on a busy host the imports (torch, Hydra, DuckDB), the procs' start and the actors'
``__init__`` take a minute before the first ``[train]`` line, and a silent minute reads as a hang.
``rlmesh run`` prints ``[start] loading rlmesh ...`` before it imports anything heavy
(:mod:`rlmesh.cli`), then each phase here with the seconds since the process started:

    [start] loading rlmesh (torch, Hydra, DuckDB)
    [start] 1.8 s  composing recipe=ppo_cartpole
    [start] 2.8 s  importing recipes/ppo.py and its actor classes (torch)
    [start] 16.9 s  run 20261206-190529-5bb4: starting 3 procs (local)
    [start] 18.5 s  creating the actors on the 3 procs (each joins first: imports, weights)
    [start] 21.0 s  actors ready; training

(times of one run at a load of 17 on 2 cores).

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
