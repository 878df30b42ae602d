"""``rlmesh clean``: reclaim what runs killed outright left on this host.

A run whose every process was SIGKILLed (the controller too) runs no cleanup code, so its
weight slots and ``.ctl`` files stay in ``/dev/shm`` (host memory, until reboot), its output-capture
FIFO folder (``$TMPDIR/rlmesh-capture-<pid>-*``) stays, and its run directory keeps a
``service.json`` with the job secret and a ``running`` status. The next
``rlmesh run``/``resume`` does the same sweep on its own; this command does it on demand.
Only what belongs to dead processes is touched.
"""

from __future__ import annotations

import argparse
import sys

from rlmesh.launch.capture import reclaim_dead_capture_dirs
from rlmesh.telemetry import run as runs
from rlmesh.weights.slots import default_shm_dir, reclaim_dead_segments


def clean_main(argv: list[str]) -> int:
    """``rlmesh clean [--shm-dir DIR]``: unlink dead runs' shm segments, settle dead runs' records."""
    p = argparse.ArgumentParser(prog="rlmesh clean", description=__doc__.split("\n\n")[1].replace("\n", " "))
    shm = default_shm_dir()
    p.add_argument("--shm-dir", default=shm, help=f"where weight segments live (default {shm})")
    a = p.parse_args(argv)
    removed = reclaim_dead_segments(a.shm_dir)
    fifos = reclaim_dead_capture_dirs()
    settled = runs.settle_dead_runs()
    print(f"rlmesh clean: removed {len(removed)} shared-memory segment(s) of dead processes from {a.shm_dir}; "
          f"removed {len(fifos)} output-capture folder(s) of dead controllers; "
          f"settled {len(settled)} run(s) of dead controllers under {runs.runs_dir()}"
          + (f" ({', '.join(settled)})" if settled else ""), file=sys.stdout)
    return 0
