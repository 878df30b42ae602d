"""Publish-while-pull across processes: 200 versions, readers over shm and tcp, never a torn state_dict."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)


@pytest.mark.timeout(180)
def test_200_versions_while_readers_pull(tmp_path):
    env = {**os.environ, "RLMESH_WEIGHTS_DIRECTORY": str(tmp_path / "dir"), "RLMESH_JOB_ID": f"stress{os.getpid()}",
           # 2 shared cores: OpenMP workers spinning against each other would make torch copies 10x slower
           "OMP_NUM_THREADS": "1", "RLMESH_TELEMETRY": "0"}
    env.pop("RLMESH_SECRET", None)
    from rlmesh.transport import Authenticator

    env["RLMESH_SECRET"] = Authenticator.new_secret().hex()

    def run(*a: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, os.path.join(HERE, "stress_worker.py"), *a], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    pub = run("pub", "200")
    try:
        assert pub.stdout.readline().strip() == "ready"
        readers = [run("read", "shm", "200"), run("read", "tcp", "200")]
        assert [r.stdout.readline().strip() for r in readers] == ["ready", "ready"]
        pub.stdin.write("go\n")
        pub.stdin.flush()
        results = [json.loads(r.communicate(timeout=150)[0]) for r in readers]
        pub.stdin.write("stop\n")
        pub.stdin.flush()
        assert pub.wait(timeout=30) == 0
    finally:
        pub.kill()
        pub.wait(timeout=10)
        leaked = [f for f in os.listdir("/dev/shm") if f.startswith(f"rlmesh-w-stress{os.getpid()}-")]
        if pub.returncode != 0:  # killed above, so no controller plugin cleaned up after it: do it here
            from rlmesh.weights.slots import cleanup_segments

            cleanup_segments(env["RLMESH_JOB_ID"])
    for res in results:
        assert res["torn"] == []
        seen = res["seen"]
        assert seen[-1] == 200 and seen == sorted(seen)
        assert len(seen) >= 10, f"readers pulled only {len(seen)} times: not concurrent enough to mean anything"
    assert leaked == []  # the publisher exited cleanly and unlinked everything itself
