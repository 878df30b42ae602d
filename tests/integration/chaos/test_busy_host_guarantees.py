"""The first round's guarantees, held on a host at load ~20: no worker outlives its controller's SIGKILL
by more than 3 s, run files are private, telemetry queries refuse writes, and a bad config is one line
before any proc starts.

Why a busy-host variant: each of these holds on a quiet machine and is tested there; checked from outside
at load ~20 on 2 cores, one of them failed once (issue 37 item 7). Here enough busy loops saturate the
CPUs that every check runs at the load a shared CI machine reaches. The bounds are the guarantees' own
(3 s for the orphans), and the waits on the controller's start-up are gross ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _support.busy import busy_loops
from _support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
HOGS = 18  # busy loops: with the suite's own procs, load ~20 on 2 cores
pytestmark = pytest.mark.serial  # it saturates the CPUs on purpose: scripts/test.sh runs it alone

CONTROLLER = textwrap.dedent("""
    import json, os, stat, time
    import rlmesh as rm
    import rlmesh.telemetry as tm
    from rlmesh.telemetry import api

    class Pinger(rm.Actor):
        @rm.endpoint
        def ping(self):
            return os.getpid()

    if __name__ == "__main__":
        procs = rm.this_host().spawn_procs(per_host={"procs": 2})
        pids = procs.spawn("p", Pinger).ping.call().get(timeout=600).values()
        tm.record("mine", a=1)
        tm.flush()
        while True:  # the row reaches the recorder through its socket: wait until a query sees it
            try:
                if tm.query("SELECT a FROM mine").to_pylist():
                    break
            except Exception:
                pass
            time.sleep(0.1)
        d = api.current_run_dir()
        modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in [d, *d.iterdir()] if p.is_file() or p == d}
        refused = []
        for sql in ("DROP TABLE mine", "DELETE FROM mine", "COPY mine TO '/tmp/x.csv'"):
            try:
                tm.query(sql)
            except tm.ReadOnlyQueryError:
                refused.append(sql)
        print(json.dumps({"pids": sorted(set(pids)), "dir": d.name, "modes": modes, "refused": refused}), flush=True)
        time.sleep(600)
""")


@pytest.fixture(scope="module")
def busy_host():
    with busy_loops(HOGS) as hogs:
        yield hogs


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    env["RLMESH_RUNS_DIR"] = str(tmp_path / "runs")
    return env


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie nobody reaped yet counts as gone
    except FileNotFoundError:
        return False


@pytest.mark.timeout(900)
def test_guarantees_hold_at_load_20(tmp_path, busy_host):
    """All four at once (the bad-config run starts beside the controller, so the suite waits once)."""
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    (tmp_path / "cfg").mkdir()
    bad = subprocess.Popen([sys.executable, "-m", "rlmesh.cli", "run", "recipe=ppo_cartpole", "trainer.lr=-1"],
                           cwd=tmp_path / "cfg", env=_env(tmp_path / "cfg"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    ctl = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=_env(tmp_path))
    try:
        line = ctl.stdout.readline()  # the controller's start-up at this load: a gross bound through the timeout
        assert line, f"the controller ended early (exit {ctl.wait()})"
        got = json.loads(line)
        load = os.getloadavg()[0]
        assert all(h.poll() is None for h in busy_host), "the busy loops must run the whole time"
        # private run files: the run folder 0700, the service record and the database files 0600
        modes = got["modes"]
        assert modes[got["dir"]] == "0o700", modes
        private = {name: m for name, m in modes.items() if name == "service.json" or name.startswith("telemetry.duckdb")}
        assert "service.json" in private and "telemetry.duckdb" in private and set(private.values()) == {"0o600"}, modes
        # telemetry refuses writes, live
        assert got["refused"] == ["DROP TABLE mine", "DELETE FROM mine", "COPY mine TO '/tmp/x.csv'"]
        # no worker alive 3 s after its controller's SIGKILL
        pids = got["pids"]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(30)
        killed_at = time.monotonic()
        wait_for(lambda: not any(_alive(p) for p in pids), 3.0, f"workers {pids} to exit (load {load:.1f})", 0.02)
        assert time.monotonic() - killed_at <= 3.5
        # a bad config: one line, exit 2, before any proc or run
        out, err = bad.communicate(timeout=540)
        assert bad.returncode == 2, err[-3000:]
        errors = [ln for ln in err.splitlines() if not ln.startswith("[start]")]
        assert errors == ["config error: trainer.lr=-1.0 is invalid: use a positive learning rate, e.g. "
                          "trainer.lr=3e-4"], err[-3000:]
        assert "Traceback" not in out + err
        assert not list((tmp_path / "cfg").glob("runs/2*/telemetry.duckdb")), "a run started before the config check"
    finally:
        for p in (ctl, bad):
            p.kill()
            p.wait()
