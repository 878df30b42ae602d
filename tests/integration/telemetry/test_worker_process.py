import subprocess
import sys

import pytest

# A well-formed advertised address (channel nonce included) of a port nothing listens on: the service is gone.
DEAD_ADDR = "tcp://127.0.0.1:9#m" + "0" * 32


@pytest.mark.timeout(60)
def test_import_is_cheap_and_loads_no_duckdb_or_arrow():
    code = ("import sys, rlmesh as rm; rm.telemetry; "
            "print(sorted(m for m in ('duckdb', 'pyarrow', 'psutil', 'pynvml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(60)
def test_worker_without_duckdb_records(tmp_path):
    """A worker-mode process ships rows without ever importing DuckDB (only the service needs it)."""
    code = (
        "import os, sys, rlmesh.telemetry as tm\n"
        "tm.record('x', a=1); tm.flush()\n"
        "print('duckdb' in sys.modules)\n"
    )
    env = {"RLMESH_TELEMETRY_ADDR": DEAD_ADDR, "RLMESH_RUN_ID": "r", "RLMESH_SECRET": "ab" * 32,
           "PATH": "/usr/bin:/bin", "RLMESH_HEALTH_INTERVAL": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.timeout(60)
def test_service_gone_the_proc_keeps_running_and_says_so_once(tmp_path):
    code = (
        "import logging, time, rlmesh.telemetry as tm\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "t0 = time.time(); n = 0\n"
        "while time.time() - t0 < 4.5:\n"
        "    tm.record('x', a=n); n += 1; time.sleep(0.001)\n"
        "print('still running after', n, 'rows')\n"
    )
    env = {"RLMESH_TELEMETRY_ADDR": DEAD_ADDR, "RLMESH_RUN_ID": "r", "RLMESH_SECRET": "ab" * 32,
           "PATH": "/usr/bin:/bin", "RLMESH_HEALTH_INTERVAL": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "still running after" in out.stdout
    assert out.stderr.count("unreachable for") == 1, out.stderr


@pytest.mark.timeout(60)
def test_forked_child_of_the_controller_records_into_the_same_run(tmp_path):
    code = (
        "import os, time, rlmesh.telemetry as tm\n"
        "from rlmesh.telemetry import api\n"
        "tm.record('x', who='parent')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    tm.record('x', who='child'); api.end_run(); os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "for _ in range(50):\n"
        "    got = sorted(r['who'] for r in tm.query('SELECT who FROM x').to_pylist())\n"
        "    if len(got) == 2: break\n"
        "    time.sleep(0.1)\n"
        "print(got)\n"
    )
    env = {"RLMESH_RUNS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "RLMESH_HEALTH_INTERVAL": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['child', 'parent']", out.stdout + out.stderr
