"""The cluster fixture: a real Slurm (slurmctld, four slurmd nodes in network namespaces, munge)
started by ``scripts/slurm_setup.sh up`` for this directory's one test module and stopped after it.

Module scope, and all Slurm tests in one file: under pytest-xdist (``--dist loadfile``) that file
runs on one worker, so one cluster serves it. A lock file keeps a second pytest session (another
checkout's) from bringing the same bridge and namespaces up or down under this one.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SETUP = ROOT / "scripts" / "slurm_setup.sh"
DIR = Path(os.environ.get("RLMESH_SLURM_DIR", str(Path.home() / ".cache" / "rlmesh" / "slurm")))
NODES = ("rlsn1", "rlsn2", "rlsn3", "rlsn4")


@dataclass
class Slurm:
    conf: str
    dir: Path

    def node_up(self, node: str) -> None:
        """Start ``node``'s slurmd again (after a test killed its host)."""
        subprocess.run(["bash", str(SETUP), "node-up", node.removeprefix("rlsn")], check=True, timeout=30)


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("the Slurm cluster needs root (network namespaces; apt the first time): "
                    "run the tests as root, or `sudo bash scripts/slurm_setup.sh` once and as root after")
    DIR.mkdir(parents=True, exist_ok=True)
    with open(DIR / ".cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        up = subprocess.run(["bash", str(SETUP), "up"], capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, f"scripts/slurm_setup.sh up failed:\n{up.stdout}\n{up.stderr}"
        conf = next(line.split("=", 1)[1] for line in up.stdout.splitlines() if line.startswith("export SLURM_CONF="))
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = conf
        try:
            yield Slurm(conf, DIR)
        finally:
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
            subprocess.run(["bash", str(SETUP), "down"], capture_output=True, timeout=60)
