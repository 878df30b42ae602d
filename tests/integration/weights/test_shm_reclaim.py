"""Issue 11 item 8: a run killed outright (every proc and the controller SIGKILLed, so no cleanup
code ran) left its weight slots and ``.ctl`` in /dev/shm forever, and its ``service.json`` (the job
secret). The next controller start reclaims both. The runs use a shared-memory folder of their
own (``RLMESH_SHM_DIR``): any controller starting meanwhile (other test workers) reclaims dead
runs' segments in /dev/shm, which would take this test's leak before it looked."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent

CONTROLLER = """
import sys, time
import rlmesh as rm
from weights_actors import Trainer
procs = rm.this_host().spawn_procs(per_host={"procs": 1})
t = procs.spawn("trainer", Trainer, "policy")
t.publish.call_one(1).get()
pub = rm.weights.Publisher("controller_side")  # the controller publishes too
import torch
pub.publish({"w": torch.zeros(16)}, version=1)
print("ready", flush=True)
time.sleep(600)
"""


def _env(tmp_path: Path, job: str, shm: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}", RLMESH_JOB_ID=job, RLMESH_RUNS_DIR=str(tmp_path / "runs"),
               RLMESH_SHM_DIR=str(shm))
    return env


@pytest.fixture
def shm():
    """A folder of this test's own in /dev/shm (tmpfs, like the real one), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="rlmesh-test-reclaim-", dir="/dev/shm"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _procs_of(job: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("RLMESH_JOB_ID") == job:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def _segments(shm: Path, job: str) -> set[str]:
    return set(glob.glob(f"{shm}/rlmesh-w-{job}-*"))


@pytest.mark.timeout(240)
def test_a_run_killed_outright_is_reclaimed_by_the_next_start(tmp_path, shm):
    job = f"reclaim{uuid.uuid4().hex[:8]}"
    before = _segments(shm, job)
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER], env=_env(tmp_path, job, shm), cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert ctl.stdout.readline().strip() == "ready", ctl.stderr.read()[-3000:]
        run_dir = next((tmp_path / "runs").glob("2*"))
        assert (run_dir / "service.json").exists()
        leaked = _segments(shm, job) - before
        assert any(s.endswith(".ctl") for s in leaked) and any("-s0" in s for s in leaked), leaked
        procs = _procs_of(job)
        assert ctl.pid in {p.pid for p in procs} and len(procs) >= 2
        for p in procs:  # freeze all first: nobody may run cleanup code (PDEATHSIG, the death sink)
            p.send_signal(signal.SIGSTOP)
        for p in procs:
            p.send_signal(signal.SIGKILL)
        ctl.wait(timeout=30)
        psutil.wait_procs(procs, timeout=30)
        assert _segments(shm, job) - before == leaked  # the leak: nothing of the run was left to clean up
        # the next controller start (any job) reclaims them, and settles the dead run's records
        nxt = subprocess.run([sys.executable, "-c", "import rlmesh as rm\n"
                              "with rm.this_host().spawn_procs(per_host={'procs': 1}): pass"],
                             env=_env(tmp_path, f"next{uuid.uuid4().hex[:8]}", shm), cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert nxt.returncode == 0, nxt.stderr[-3000:]
        assert _segments(shm, job) == before
        assert not (run_dir / "service.json").exists()
        assert '"status": "crashed"' in (run_dir / "run.json").read_text()
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
