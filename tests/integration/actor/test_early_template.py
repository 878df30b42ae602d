"""``rm.this_host()`` starts the start-up template before the controller imports its runtime.

Each case runs a fresh controller program (the early start only happens in a process that has not
imported the controller yet), and checks with real processes that the procs ``spawn_procs`` launches
are forked from that very template: the early start only pays if its environment matches the
launch's, else a second template would start and the first would be wasted.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PROGRAM = textwrap.dedent("""
    import json, os, sys, threading
    import rlmesh as rm
    from rlmesh.launch import forkserver, starters

    started = []  # (controller imported yet?, thread) for every template started
    init = forkserver.ForkServer.__init__
    def recording_init(self, *a, **k):
        started.append(("rlmesh.actor.controller" in sys.modules, threading.current_thread().name))
        init(self, *a, **k)
    forkserver.ForkServer.__init__ = recording_init

    class Where(rm.Actor):
        @rm.endpoint
        def ppid(self):
            return os.getppid()

    def main():
        host = rm.this_host(**json.loads(sys.argv[1]))
        early = [s.pid for s in starters.STARTERS.values()]
        with host.spawn_procs(per_host={"procs": 2}) as procs:
            ppids = procs.spawn("where", Where).ppid.call().get(timeout=60).values()
        return {"started": started, "early": early, "ppids": ppids, "me": os.getpid(),
                "starters": [s.pid for s in starters.STARTERS.values()]}

    if sys.argv[2] == "thread":  # this_host() from a thread that ends before the procs do
        out = {}
        t = threading.Thread(target=lambda: out.update(main()), name="user-thread")
        t.start(); t.join()
    else:
        out = main()
    print("RESULT " + json.dumps(out), flush=True)
""")


def run(tmp_path, opts: dict, where: str = "main", **env_extra: str) -> dict:
    script = tmp_path / "controller.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": ROOT, "RLMESH_RUNS_DIR": str(tmp_path / "runs"), **env_extra}
    for k in ("RLMESH_SECRET", "RLMESH_JOB_ID"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, str(script), json.dumps(opts), where], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=110)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_this_host_starts_the_template_first_and_spawn_procs_forks_from_it(tmp_path):
    r = run(tmp_path, {})
    assert r["started"] == [[False, "MainThread"]], r  # one template, started before the controller's import
    assert len(r["early"]) == 1 and r["starters"] == r["early"], r
    assert r["ppids"] == r["early"] * 2, r  # both procs forked from it


def test_no_early_template_off_the_main_thread(tmp_path):
    """A template dies with the thread that started it: a user's short-lived thread must not start it."""
    r = run(tmp_path, {}, "thread")
    assert r["early"] == [], r
    assert len(r["started"]) == 1 and r["started"][0][0] is True, r  # started later, by the launcher
    assert r["started"][0][1] != "user-thread", r
    assert r["ppids"] == r["starters"] * 2, r


def test_no_early_template_when_templates_are_off(tmp_path):
    r = run(tmp_path, {"fork_server": False})
    assert r["started"] == [] and r["early"] == [], r
    assert r["ppids"] == [r["me"]] * 2, r  # plain children of the controller
    r = run(tmp_path, {}, RLMESH_FORKSERVER="0")
    assert r["started"] == [] and r["ppids"] == [r["me"]] * 2, r
