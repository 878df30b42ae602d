"""Warm restarts: relaunched procs of restartable meshes are forked from the local launcher's fork server.

Real processes throughout: a replacement forked from the template serves, has its own
env and identity, is seen dead when killed again, and nothing (template or children)
outlives ``procs.stop()`` or a SIGKILLed controller.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import rlmesh as rm
from rlmesh.actor import hooks
from rlmesh.actor.controller import Controller
from rlmesh.actor.payload import modules_in_payload
from rlmesh.launch import starters
from rlmesh.transport.serialization import dumps
from proc_checks import wait_gone  # noqa: E402

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# A module imported by name (not shipped by value) that imports torch: what the template preloads.
PROBE = textwrap.dedent("""
    import os
    import torch
    import rlmesh as rm

    class Probe(rm.Actor):
        @rm.endpoint
        def info(self):
            c = rm.context()
            return {"pid": os.getpid(), "ppid": os.getppid(), "incarnation": c.proc.incarnation,
                    "rank": c.rank, "proc_id": c.proc.proc_id, "proc_rank": c.proc.rank,
                    "mark": os.environ.get("FS_MARK"), "cwd": os.getcwd(),
                    "torch": float(torch.ones(2).sum())}

        @rm.endpoint
        def collect(self):
            import gc
            import psutil
            me = psutil.Process()
            before = me.memory_full_info().uss
            gc.collect()
            return {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                    "uss_growth": me.memory_full_info().uss - before}
""")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    d = tmp_path_factory.mktemp("fsmod")
    (d / "fs_probe_actors.py").write_text(PROBE)
    with pytest.MonkeyPatch.context() as mp:  # sys.path and sys.modules as they were, after the module
        mp.syspath_prepend(str(d))
        import fs_probe_actors

        yield fs_probe_actors.Probe
        sys.modules.pop("fs_probe_actors", None)


@pytest.fixture
def events():
    got = []
    hooks.add_event_sink(got.append)
    yield got
    hooks.remove_event_sink(got.append)




def wait_event(events, kind, incarnation, rank, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        hit = [e for e in events if e.kind == kind and e.incarnation == incarnation and e.rank == rank]
        if hit:
            return hit[-1]
        assert time.monotonic() < deadline, f"no {kind!r} event for rank {rank} incarnation {incarnation}"
        time.sleep(0.005)


def launcher_of(procs):
    return Controller.current().procs[procs.proc_ids[0]].launcher


def test_payload_names_the_actor_module(probe):
    mods = modules_in_payload(dumps((probe, (), {})))
    assert "fs_probe_actors" in mods and "__main__" not in mods


def test_restarts_are_forked_warm_and_nothing_outlives_stop(probe, events):
    procs = rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=2),
                                       env={"FS_MARK": "per-mesh"})
    seen = set()
    try:
        p = procs.spawn("probe", probe)
        first = p.info.call().get(timeout=30).values()
        seen.update(i["pid"] for i in first)
        launcher = launcher_of(procs)
        assert launcher.wait_fork_server(procs.name, 30), "the fork server never became ready"
        server_pid = launcher.fork_server_pid(procs.name)
        # forked from the controller's start-up template of the same environment: torch and the
        # worker runtime came imported, so the restart template cost a fork, not a Python start
        starter = psutil.Process(server_pid).ppid()
        assert starter in {s.pid for s in starters.STARTERS.values()} and psutil.Process(starter).ppid() == os.getpid()

        # (1) SIGKILL rank 1: the replacement is forked from the template and serves.
        old = procs.pids[1]
        os.kill(old, signal.SIGKILL)
        ev = wait_event(events, "restarted", 1, 1)
        print(f"\nforked restart: serving_s={ev.serving_s:.3f}")
        assert ev.serving_s is not None and ev.serving_s < 10 and ev.recovery_s is None  # no progress reported here
        info = p.info.call().get(timeout=30).values()[1]
        # serving is not recovered: the program says when the replacement made progress (a recipe: its
        # next train step or rollout), and recovery_s runs from the kill to then; said once, not twice
        Controller.current().progressed(procs.proc_ids, "probe answered")
        rec = wait_event(events, "recovered", 1, 1)
        assert rec.reason == "probe answered" and rec.serving_s == ev.serving_s and rec.recovery_s > ev.serving_s
        Controller.current().progressed(procs.proc_ids, "probe answered")
        assert sum(e.kind == "recovered" for e in events) == 1
        seen.add(info["pid"])
        assert info["pid"] != old and info["pid"] == procs.pids[1]
        assert info["ppid"] == server_pid  # forked, not started by the controller
        # (3) env and identity as a fresh worker of this proc would have them
        assert (info["incarnation"], info["rank"], info["proc_rank"]) == (1, 1, 1)
        assert info["proc_id"] == procs.proc_ids[1]
        assert info["mark"] == "per-mesh" and info["cwd"] == os.getcwd() and info["torch"] == 2.0
        assert procs.incarnations() == [0, 1]

        # (2) the forked replacement's death is seen through poll() too, and the next restart works.
        t0 = time.monotonic()
        os.kill(info["pid"], signal.SIGKILL)
        died = wait_event(events, "died", 1, 1)
        assert died.signal == signal.SIGKILL and time.monotonic() - t0 < 1.0
        ev2 = wait_event(events, "restarted", 2, 1)
        print(f"second forked restart: serving_s={ev2.serving_s:.3f}")
        info2 = p.info.call().get(timeout=30).values()[1]
        seen.add(info2["pid"])
        assert info2["incarnation"] == 2 and info2["ppid"] == server_pid and info2["mark"] == "per-mesh"
        assert p.info.call().get(timeout=30).values()[0]["incarnation"] == 0
    finally:
        procs.stop()
    # (5) no template, no forked child left
    wait_gone([*seen, server_pid], 10)
    assert launcher.fork_server_pid(procs.name) is None


def test_a_forked_child_collects_only_its_own_objects(probe, events):
    """The template's objects (torch's among them) are frozen before each fork: a full collection
    in the child neither scans them nor copies their pages (unfrozen: +64 MB per worker)."""
    with rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=1)) as procs:
        p = procs.spawn("probe", probe)
        assert launcher_of(procs).wait_fork_server(procs.name, 30), "the fork server never became ready"
        os.kill(procs.pids[0], signal.SIGKILL)
        wait_event(events, "restarted", 1, 0)
        info = p.collect.call_one().get(timeout=30)
    print(f"\nforked child: {info}")
    assert info["frozen"] > 100_000  # the template's torch, at least
    assert info["tracked"] < info["frozen"] / 4
    assert info["uss_growth"] < 16 * 2**20


def test_a_dead_fork_server_costs_its_running_children_nothing_and_is_replaced(probe, events, caplog):
    """A SIGKILLed template used to take every proc forked from it down ("exited after its fork
    server died"). Now they run on, watched; the next restart starts from the start-up template
    while a new restart template starts, and the restart after that is forked from it."""
    with rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=3)) as procs:
        p = procs.spawn("probe", probe)
        launcher = launcher_of(procs)
        assert launcher.wait_fork_server(procs.name, 30)
        server_pid = launcher.fork_server_pid(procs.name)
        os.kill(procs.pids[0], signal.SIGKILL)
        wait_event(events, "restarted", 1, 0)
        forked = p.info.call().get(timeout=30).values()[0]
        assert forked["ppid"] == server_pid
        os.kill(server_pid, signal.SIGKILL)
        wait_gone([server_pid], 10)
        again = p.info.call().get(timeout=30).values()[0]  # the same proc, still serving
        assert again["pid"] == forked["pid"] and again["incarnation"] == 1
        assert not [e for e in events if e.kind == "died" and e.incarnation == 1]
        os.kill(forked["pid"], signal.SIGKILL)
        wait_event(events, "died", 1, 0)
        wait_event(events, "restarted", 2, 0, timeout=30)
        info = p.info.call().get(timeout=30).values()[0]
        assert info["incarnation"] == 2 and info["ppid"] in [s.pid for s in starters.STARTERS.values()]
        assert launcher.wait_fork_server(procs.name, 30), "no new restart template"
        new_server = launcher.fork_server_pid(procs.name)
        assert new_server != server_pid
        os.kill(info["pid"], signal.SIGKILL)
        wait_event(events, "restarted", 3, 0, timeout=30)
        assert p.info.call().get(timeout=30).values()[0]["ppid"] == new_server
    assert any("fork server" in r.getMessage() and "died" in r.getMessage() for r in caplog.records)


def test_a_killed_start_up_template_costs_its_procs_nothing_and_restarts_still_come_up(probe, events):
    """The restart template is the start-up template's child and dies with it; the procs forked
    from either run on. The proc's next incarnation comes from a new start-up template."""
    with rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=3)) as procs:
        p = procs.spawn("probe", probe)
        launcher = launcher_of(procs)
        assert launcher.wait_fork_server(procs.name, 30)
        server_pid = launcher.fork_server_pid(procs.name)
        starter, first = psutil.Process(server_pid).ppid(), procs.pids[0]
        os.kill(starter, signal.SIGKILL)
        wait_gone([server_pid, starter], 10)
        assert p.info.call().get(timeout=30).values()[0]["pid"] == first  # still serving
        os.kill(first, signal.SIGKILL)
        wait_event(events, "restarted", 1, 0, timeout=60)
        info = p.info.call().get(timeout=30).values()[0]
        assert info["incarnation"] == 1 and info["pid"] != first and info["ppid"] not in (starter, server_pid)


def test_a_restart_template_that_cannot_be_forked_starts_as_its_own_python(probe, events, tmp_path, monkeypatch):
    """Its socket's path must fit in 108 bytes: under a long temporary folder the template is started
    as a fresh Python, as before, and restarts still fork from it."""
    import tempfile

    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=1)) as procs:
        p = procs.spawn("probe", probe)
        launcher = launcher_of(procs)
        assert launcher.wait_fork_server(procs.name, 60)
        server_pid = launcher.fork_server_pid(procs.name)
        assert psutil.Process(server_pid).ppid() == os.getpid()
        os.kill(procs.pids[0], signal.SIGKILL)
        wait_event(events, "restarted", 1, 0)
        assert p.info.call().get(timeout=30).values()[0]["ppid"] == server_pid


@pytest.mark.parametrize("how", ["env", "arg"])
def test_opt_out_restarts_with_a_fresh_python(probe, events, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("RLMESH_FORKSERVER", "0")
    host = rm.this_host() if how == "env" else rm.this_host(fork_server=False)
    with host.spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=1)) as procs:
        p = procs.spawn("probe", probe)
        old = p.info.call().get(timeout=30).values()[0]["pid"]
        assert launcher_of(procs).fork_server_pid(procs.name) is None
        os.kill(old, signal.SIGKILL)
        wait_event(events, "restarted", 1, 0, timeout=30)
        info = p.info.call().get(timeout=30).values()[0]
        assert info["incarnation"] == 1 and info["pid"] != old and info["ppid"] == os.getpid()


def test_no_restart_policy_no_fork_server(probe):
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        procs.spawn("probe", probe).info.call().get(timeout=30)
        assert launcher_of(procs).fork_server_pid(procs.name) is None


class Where(rm.Actor):
    """The probe's identity fields without its torch import (first launches need no preload)."""

    @rm.endpoint
    def info(self):
        c = rm.context()
        return {"pid": os.getpid(), "ppid": os.getppid(), "rank": c.rank, "proc_rank": c.proc.rank,
                "mark": os.environ.get("FS_MARK"), "cwd": os.getcwd()}


def test_first_launches_are_forked_from_the_start_up_template():
    """Every first launch forks one shared template (the worker and its plugins imported once);
    each proc still gets its own mesh's env, identity and pid, and a mesh with another env gets
    its own template."""
    host = rm.this_host()
    with host.spawn_procs(per_host={"procs": 2}, env={"FS_MARK": "a"}) as a, \
            host.spawn_procs(per_host={"procs": 1}, env={"FS_MARK": "b"}) as b:
        ia = a.spawn("where_a", Where).info.call().get(timeout=30).values()
        ib = b.spawn("where_b", Where).info.call().get(timeout=30).values()
        starter_pids = {s.pid for s in starters.STARTERS.values()}  # shared by every launcher of the controller
        assert ia[0]["ppid"] == ia[1]["ppid"] != ib[0]["ppid"]  # the two meshes' environments differ
        assert {ia[0]["ppid"], ib[0]["ppid"]} <= starter_pids
        assert [i["mark"] for i in ia] == ["a", "a"] and ib[0]["mark"] == "b"
        assert [(i["rank"], i["proc_rank"]) for i in ia] == [(0, 0), (1, 1)]
        assert len({i["pid"] for i in [*ia, *ib]}) == 3 and all(i["cwd"] == os.getcwd() for i in ia)
    wait_gone([i["pid"] for i in [*ia, *ib]], 10)  # stop() ends them; the templates stay for the next mesh
    assert psutil.pid_exists(ia[0]["ppid"]) and psutil.pid_exists(ib[0]["ppid"])  # (shutdown stops them: see below)


class WhichTest(rm.Actor):
    @rm.endpoint
    def info(self):
        return {"ppid": os.getppid(), "test": os.environ.get("PYTEST_CURRENT_TEST")}


def test_each_test_of_a_suite_forks_from_the_same_template(monkeypatch):
    """pytest names the running test in the environment; a template keyed by it was started anew
    (torch imported again, ~1.8 s) for every test of a user's suite, and each idled on to the end.
    Each proc still sees the value of its own launch."""
    host = rm.this_host()
    seen = []
    for test in ("test_a.py::one (call)", "test_b.py::two (call)"):
        monkeypatch.setenv("PYTEST_CURRENT_TEST", test)
        with host.spawn_procs(per_host={"procs": 1}) as procs:
            seen.append(procs.spawn("which_test", WhichTest).info.call_one().get(timeout=60))
    assert seen[0]["ppid"] == seen[1]["ppid"] in {s.pid for s in starters.STARTERS.values()}, seen
    assert [s["test"] for s in seen] == ["test_a.py::one (call)", "test_b.py::two (call)"]


HINTED = textwrap.dedent("""
    import os
    IMPORTED_IN = os.getpid()  # the process that imported this module first

    def on_controller_start(info):
        return {}
""")


class ImportedWhere(rm.Actor):
    @rm.endpoint
    def where(self, mod: str):
        m = sys.modules.get(mod)
        return {"imported_in": getattr(m, "IMPORTED_IN", None), "ppid": os.getppid(), "pid": os.getpid()}


def test_the_template_imports_what_the_plugins_say_their_workers_will_before_its_first_fork(tmp_path, monkeypatch):
    """A controller plugin names its workers' modules; the start-up template imports them while the
    controller still runs its plugins, so forked procs find them loaded (issue 16: the first procs
    used to wait ~40 ms for the template to import the telemetry plugin after the plugins ran)."""
    (tmp_path / "fs_hinted_plugin.py").write_text(HINTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "fs_hinted_plugin:on_controller_start"
    hooks.register_controller_plugin(spec, worker_modules=("fs_hinted_plugin",))
    hooks.invalidate_controller_plugins()
    try:
        with rm.this_host().spawn_procs(per_host={"procs": 2}, env={"FS_MARK": "hinted"}) as procs:
            got = procs.spawn("imported_where", ImportedWhere).where.call("fs_hinted_plugin").get(timeout=30).values()
        assert [g["imported_in"] for g in got] == [g["ppid"] for g in got], got  # imported by the template
        assert all(g["ppid"] != g["pid"] for g in got)
    finally:
        with hooks._lock:
            hooks._controller_plugins.remove(spec)
            hooks._worker_module_hints.remove("fs_hinted_plugin")
        hooks.invalidate_controller_plugins()


def test_requests_queued_on_a_template_that_dies_start_afresh(tmp_path):
    """A template that dies before forking what was queued on it (here: it never starts, like a
    killed one) is only a shortcut gone: each queued request starts the plain way instead of
    failing with "the fork server died". Without a fallback, or once killed, it is reported."""
    from rlmesh.launch.forkserver import ForkServer
    from rlmesh.launch.local import LocalProcHandle

    doomed = tmp_path / "doomed.sh"  # holds the request pipe open a while, forks nothing, exits
    doomed.write_text("#!/bin/sh\nsleep 3\nexit 3\n")
    doomed.chmod(0o755)
    srv = ForkServer(str(doomed), dict(os.environ), os.getcwd(), preload=())
    started = []

    def fresh(code):
        def start():
            started.append(code)
            return LocalProcHandle(subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"]))
        return start

    queued = srv.fork([], {}, os.getcwd(), wait_s=0.0, fallback=fresh(7))
    bare = srv.fork([], {}, os.getcwd(), wait_s=0.0)
    killed = srv.fork([], {}, os.getcwd(), wait_s=0.0, fallback=fresh(9))
    killed.kill()
    deadline = time.monotonic() + 60
    while (queued.poll() is None or bare.poll() is None) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queued.poll() == (7, None) and queued.pid is not None
    assert bare.poll() == (None, None, "the fork server died before forking it")
    assert killed.poll() == (None, None, "the fork server died before forking it")
    assert started == [7]  # the killed request was not started afresh
    srv.close()


def test_opt_out_starts_first_procs_with_a_fresh_python(monkeypatch):
    monkeypatch.setenv("RLMESH_FORKSERVER", "0")
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        info = procs.spawn("where_plain", Where).info.call().get(timeout=30).values()[0]
        assert info["ppid"] == os.getpid()


CONTROLLER = textwrap.dedent("""
    import os, signal, sys, time
    import rlmesh as rm
    from rlmesh.actor import hooks
    from rlmesh.actor.controller import Controller
    from rlmesh.launch.starters import STARTERS

    class Pinger(rm.Actor):
        @rm.endpoint
        def pid(self):
            return os.getpid()

    if __name__ == "__main__":
        ev = []
        hooks.add_event_sink(ev.append)
        procs = rm.this_host().spawn_procs(per_host={"procs": 1}, restart=rm.Restart(max_restarts=3))
        p = procs.spawn("p", Pinger)
        first = p.pid.call().get(timeout=30).values()[0]
        launcher = Controller.current().procs[procs.proc_ids[0]].launcher
        assert launcher.wait_fork_server(procs.name, 30)
        os.kill(first, signal.SIGKILL)
        while not [e for e in ev if e.kind == "restarted"]:
            time.sleep(0.01)
        forked = p.pid.call().get(timeout=30).values()[0]
        plain = rm.this_host().spawn_procs(per_host={"procs": 1})  # a first launch: forked from the starter
        other = plain.spawn("p2", Pinger).pid.call().get(timeout=30).values()[0]
        [starter] = [s.pid for s in STARTERS.values()]  # one template: the one this_host() started early
        print(launcher.fork_server_pid(procs.name), forked, starter, other, flush=True)
        time.sleep(600)
""")


def test_no_orphans_after_controller_sigkill(tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    env = {**os.environ, "PYTHONPATH": ROOT}
    for k in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_FORKSERVER"):
        env.pop(k, None)
    ctl = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        server_pid, forked, starter, other = (int(x) for x in ctl.stdout.readline().split())
        assert psutil.Process(forked).ppid() == server_pid and psutil.Process(other).ppid() == starter
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        wait_gone([server_pid, forked, starter, other], 10)
    finally:
        ctl.kill()
