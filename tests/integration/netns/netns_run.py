"""Run a controller program of ``scenario.py`` on the bridge of a :class:`~rlmesh.launch.netns.HostNetwork`."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from rlmesh.launch.netns import HostNetwork

HERE = Path(__file__).parent


def scenario_env(net: HostNetwork, runs_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID", "RLMESH_SECRET", "RLMESH_JOB_ID",
                                "RLMESH_WORKER_PLUGINS", "RLMESH_BIND_HOST", "RLMESH_ADVERTISE_HOST"))}
    env.update({"RLMESH_RUNS_DIR": str(runs_dir), "RLMESH_BIND_HOST": net.address,
                "NETNS_TEST_HOSTS": json.dumps([dataclasses.asdict(h) for h in net.hosts]),
                "PYTHONPATH": os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
                # the hosts' procs quit after this much silence from their controller (10 s by default, as on
                # real hosts); here it shares two cores with them, and at load 45-50 one heard nothing for 16 s
                "RLMESH_CONTROLLER_TIMEOUT_S": "120"})
    env.update(extra or {})
    return env


def run_scenario(net: HostNetwork, name: str, runs_dir: Path, timeout: float,
                 extra_env: dict[str, str] | None = None) -> dict:
    """Run ``scenario.py name``; its last stdout line is a JSON object of what it saw."""
    p = subprocess.run([sys.executable, str(HERE / "scenario.py"), name], env=scenario_env(net, runs_dir, extra_env),
                       capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert p.returncode == 0 and lines, f"scenario {name} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return json.loads(lines[-1])
