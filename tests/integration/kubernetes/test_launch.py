"""Procs as pods through a real kube-apiserver: a mesh serving calls, a deleted pod's death and
replacement, and cleanup after a crashed controller."""

from __future__ import annotations

import ast
import json
import os
import select
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import rlmesh as rm
from rlmesh.actor import hooks
from rlmesh.telemetry import api as telemetry_api
from rlmesh.launch.kubernetes import KubernetesCluster, KubernetesConfig, MeshResources
from rlmesh.launch.kubernetes.manifests import run_selector, secret_name
from _support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)
IMAGE = "rlmesh-test:local"  # the fake kubelet runs every image as this checkout's venv


@pytest.fixture
def events():
    got: list[hooks.ProcEvent] = []
    hooks.add_event_sink(got.append)
    yield got
    hooks.remove_event_sink(got.append)


def run_objects(k8s, run: str) -> list[str]:
    sel = run_selector(run)
    pods = k8s.core.list_namespaced_pod(k8s.namespace, label_selector=sel).items
    secrets = k8s.core.list_namespaced_secret(k8s.namespace, label_selector=sel).items
    return [f"pod/{p.metadata.name}" for p in pods] + [f"secret/{s.metadata.name}" for s in secrets]


def test_two_proc_mesh_serves_calls_through_pods(k8s):
    from k8s_actors import Probe

    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-mesh", env={"RLMESH_TEST_EXTRA": "yes"})
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 2}, name="k8s-gen")
        probes = procs.spawn("k8s-probe", Probe, tag="t")
        assert list(probes.add.call(2, 3).get(timeout=20)) == [5, 5]
        where = [probes.slice(procs=r).where.call_one().get(timeout=20) for r in range(2)]
        pods = {p.metadata.name: p for p in k8s.core.list_namespaced_pod(
            k8s.namespace, label_selector=run_selector("it-mesh")).items}
        assert sorted(pods) == ["it-mesh-k8s-gen-0-0", "it-mesh-k8s-gen-1-0"]
        secret = k8s.core.read_namespaced_secret(secret_name("it-mesh"), k8s.namespace)
        for w in where:
            pod = pods[w["pod"]]
            assert w["tag"] == "t" and w["secret_set"] and w["extra"] == "yes"
            assert w["advertise"] == pod.status.pod_ip  # the downward API reached the worker
            assert pod.metadata.labels["rlmesh.io/mesh"] == "k8s-gen"
            assert pod.metadata.labels["rlmesh.io/rank"] == str(w["rank"])
            owner = pod.metadata.owner_references[0]
            assert (owner.kind, owner.uid) == ("Secret", secret.metadata.uid)
            spec = k8s.api.sanitize_for_serialization(pod.spec)
            assert os.environ["RLMESH_SECRET"] not in repr(spec), "the job secret leaked into a pod spec"
            ref = [e for e in spec["containers"][0]["env"] if e["name"] == "RLMESH_SECRET"][0]
            assert ref["valueFrom"]["secretKeyRef"]["name"] == secret.metadata.name
        procs.stop()
        # stopped procs' pods are removed; the Secret stays until the cluster closes
        wait_for(lambda: run_objects(k8s, "it-mesh") == [f"secret/{secret.metadata.name}"], 20, "pods removed")
    assert run_objects(k8s, "it-mesh") == []


def _read_until(proc: subprocess.Popen, text: str, timeout: float = 60.0) -> str:
    """What ``proc`` wrote to stdout up to and including ``text`` (a pipe, read as it comes)."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"did not see {text!r}; got:\n{seen[-3000:]}"
        if select.select([proc.stdout], [], [], min(left, 0.5))[0]:
            chunk = os.read(proc.stdout.fileno(), 65536).decode("utf-8", "replace")
            assert chunk, f"output ended before {text!r}; got:\n{seen[-3000:]}"
            seen += chunk
    return seen


def test_rlmesh_debug_attaches_to_an_actor_paused_in_a_pod(k8s):
    """breakpoint() in an actor in a pod: `rlmesh debug` on the controller's side finds it through
    the run's debug_sessions table (the pod has no folder on the controller's host), attaches over
    the pod's own address, changes a local, and the caller gets the changed result."""
    from k8s_actors import Probe

    rm.telemetry.end_run()
    rm.telemetry.start_run()
    run_dir = telemetry_api.current_run_dir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    cli = [sys.executable, "-m", "rlmesh.cli", "debug", str(run_dir)]

    def listed():
        out = subprocess.run(cli + ["--format", "json"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["paused"]

    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-debug")
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 1}, name="k8s-dbg")
        fut = procs.spawn("k8s-pauser", Probe).pause.call_one(20)
        paused = wait_for(listed, 60, "the paused actor listed")
        assert [(p["mesh"], p["rank"], p["function"], p["reason"]) for p in paused] == [
            ("k8s-pauser", 0, "pause", "breakpoint()")]
        assert paused[0]["addr"].startswith("tcp://127.0.1."), paused  # the pod's own address
        assert not list((run_dir / "debug").glob("*.json"))  # no record on this host: found in SQL
        session = subprocess.Popen(cli + ["--attach", "k8s-pauser[0]"], env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            _read_until(session, "(Pdb) ")
            session.stdin.write(b"p y\n")
            session.stdin.flush()
            assert "21" in _read_until(session, "(Pdb) ")
            session.stdin.write(b"y = 5\ncontinue\n")
            session.stdin.flush()
            _read_until(session, "resumed")
            assert session.wait(30) == 0
        finally:
            if session.poll() is None:
                session.kill()
        assert fut.get(timeout=30) == 10
        wait_for(lambda: listed() == [], 30, "the resumed actor no longer listed")


def test_pod_output_lands_in_the_logs_table(k8s, caplog):
    """The launcher follows each pod's log through the API server (proxied to the node's kubelet endpoint)."""
    caplog.set_level("DEBUG", "rlmesh.launch.pod_logs")  # why a follower gave up, on failure
    from k8s_actors import Probe

    rm.telemetry.end_run()  # a run of this test's own: its service is the one the pods' lines go to
    rm.telemetry.start_run()
    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-logs")
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 2}, name="k8s-talk")
        probes = procs.spawn("k8s-talker", Probe)
        probes.say.call("pod-log-marker").get(timeout=20)
        sql = ("SELECT mesh, rank, proc, stream, message FROM logs WHERE message LIKE 'pod-log-marker%' "
               "ORDER BY rank")
        try:
            rows = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(rm.telemetry.query(sql).to_pylist()), 30,
                            "both pods' lines in logs")
        except AssertionError:
            try:  # what the log API itself answers, for the failure message
                direct = k8s.core.read_namespaced_pod_log("it-logs-k8s-talk-0-0", k8s.namespace, timestamps=True)
            except Exception as exc:  # noqa: BLE001
                direct = f"{type(exc).__name__}: {exc}"
            raise AssertionError(f"pod log API answers: {str(direct)[-2000:]}") from None
        assert [(r["mesh"], r["rank"], r["proc"], r["stream"], r["message"]) for r in rows] == [
            ("k8s-talk", 0, "k8s-talk.0", "stdout", "pod-log-marker from rank 0"),
            ("k8s-talk", 1, "k8s-talk.1", "stdout", "pod-log-marker from rank 1")]
        procs.stop()


def test_deleted_pod_is_actor_died_and_its_replacement_rejoins(k8s, events):
    from k8s_actors import Probe

    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-restart")
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=1),
                                    name="k8s-regen")
        probes = procs.spawn("k8s-phoenix", Probe)
        victim = probes.slice(procs=1)
        pending = victim.sleep.call_one(60)
        time.sleep(0.3)
        t0 = time.monotonic()
        k8s.core.delete_namespaced_pod("it-restart-k8s-regen-1-0", k8s.namespace, grace_period_seconds=5)
        with pytest.raises(rm.ActorDied) as ei:
            pending.get(timeout=20)
        died_after = time.monotonic() - t0
        assert ei.value.rank == 1 and "pod deleted" in str(ei.value)
        procs.wait_alive(timeout=45)
        info = victim.where.call_one().get(timeout=20)
        serving_after = time.monotonic() - t0
        assert info["incarnation"] == 1 and info["pod"] == "it-restart-k8s-regen-1-1"
        assert victim.was_restarted.call_one().get(timeout=10) is True
        assert probes.slice(procs=0).where.call_one().get(timeout=10)["incarnation"] == 0
        kinds = [e.kind for e in events if e.proc_mesh == "k8s-regen" and e.rank == 1]
        assert kinds[:4] == ["spawned", "died", "spawned", "restarted"], kinds
        died = [e for e in events if e.kind == "died" and e.proc_mesh == "k8s-regen"][0]
        assert "pod deleted" in died.reason
        rows = rm.telemetry.query("SELECT event, incarnation, reason FROM actors WHERE proc = 'k8s-regen.1' "
                                  "ORDER BY ts").to_pylist()
        assert [r["event"] for r in rows][:4] == ["spawned", "died", "spawned", "restarted"], rows
        assert "pod deleted" in rows[1]["reason"]
        print(f"\n[k8s] pod delete -> ActorDied {died_after:.2f}s, -> replacement serving {serving_after:.2f}s")
        k8s.timings["delete_to_died_s"] = died_after
        k8s.timings["delete_to_serving_s"] = serving_after
    wait_for(lambda: run_objects(k8s, "it-restart") == [], 20, "everything removed")


def test_watch_resumes_after_it_expires(k8s, events, monkeypatch):
    """Watches end every watch_timeout_s; a death after several resumptions is still seen at once."""
    from k8s_actors import Probe

    from rlmesh.launch.kubernetes.pods import PodWatcher

    monkeypatch.setattr(PodWatcher, "watch_timeout_s", 1)
    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-rewatch")
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 1}, name="k8s-rewatch")
        pending = procs.spawn("k8s-rewatch-probe", Probe).sleep.call_one(60)
        time.sleep(3.5)  # three watch requests have expired and resumed by now
        t0 = time.monotonic()
        k8s.core.delete_namespaced_pod("it-rewatch-k8s-rewatch-0-0", k8s.namespace, grace_period_seconds=5)
        with pytest.raises(rm.ActorDied, match="pod deleted"):
            pending.get(timeout=20)
        assert time.monotonic() - t0 < 1.0  # from the watch, not the 1.5 s heartbeat timeout


def test_stopping_the_watch_ends_its_thread_at_once(k8s):
    """stop() ends the thread blocked in the watch's read, so no watch thread is left to wake while
    the interpreter finalizes (an ``rlmesh run`` once ended with SIGABRT that way)."""
    from rlmesh.launch.kubernetes.pods import PodWatcher

    w = PodWatcher(k8s.core, k8s.namespace, run_selector("it-no-pods"), lambda name, pod: None, lambda names: None)
    w.start()
    # the thread is inside a watch request that no event will end for watch_timeout_s (45 s)
    wait_for(lambda: w._watch is not None and getattr(w._watch, "_resp", None) is not None, 20, "watch open")
    t0 = time.monotonic()
    w.stop()
    assert not w.is_alive(), "the watch thread outlived stop()"
    assert time.monotonic() - t0 < 5.0


def test_closing_the_cluster_stops_its_pod_log_followers(k8s):
    """A follower inside the log API when the interpreter finalizes aborts the process, so stop()
    ends one blocked in an open stream at once, and closing the cluster leaves none running."""
    from k8s_actors import Probe

    from rlmesh.launch.output import ProcMeta
    from rlmesh.launch.pod_logs import PodLogFollower

    def followers() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("rlmesh-podlog-") and t.is_alive()]

    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-follow")
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 1}, name="k8s-follow")
        procs.spawn("k8s-follow-probe", Probe).say.call("up").get(timeout=20)
        pod = "it-follow-k8s-follow-0-0"
        mine = PodLogFollower(k8s.core, k8s.namespace, pod, ProcMeta("x", "x", 0, 0, pod), lambda: False)
        mine.start()
        wait_for(lambda: mine._resp is not None, 20, "the log stream open")   # blocked reading it now
        t0 = time.monotonic()
        mine.stop()
        mine.join(5)
        assert not mine.is_alive() and time.monotonic() - t0 < 5.0
        assert followers(), "the launcher follows its pod's log"
    assert followers() == []   # at once: close() waited for them


@pytest.mark.parametrize("how,reason", [("oom", "OOMKilled (memory limit 1Gi"),
                                        ("evict", "evicted: The node was low on resource: memory")])
def test_oom_killed_and_evicted_pods_are_dead_procs_with_the_reason(k8s, events, how, reason):
    from k8s_actors import Probe

    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run=f"it-{how}",
                           default_resources=MeshResources(memory="1Gi"))
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 1}, name=f"k8s-{how}")
        probe = procs.spawn(f"k8s-{how}-probe", Probe)
        pending = probe.sleep.call_one(60)
        k8s.kubelet.node_kill(k8s.namespace, f"it-{how}-k8s-{how}-0-0", how)
        with pytest.raises(rm.ActorDied) as ei:
            pending.get(timeout=20)
        assert reason in str(ei.value)
        died = [e for e in events if e.kind == "died" and e.proc_mesh == f"k8s-{how}"]
        assert died and reason in died[0].reason and died[0].signal == 9
    wait_for(lambda: run_objects(k8s, f"it-{how}") == [], 20, "everything removed")


def test_deleting_the_controller_pod_garbage_collects_the_run(k8s, events):
    """controller pod -> owns the Secret -> owns the worker pods: the real garbage collector removes it all."""
    from k8s_actors import Probe

    ctl = k8s.core.create_namespaced_pod(k8s.namespace, {
        "metadata": {"name": "it-gc-controller"},
        "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "controller", "image": IMAGE, "command": ["sleep", "120"]}]}})
    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-gc", controller_pod="it-gc-controller")
    cluster = KubernetesCluster(cfg, api_client=k8s.api)
    try:
        procs = cluster.spawn_procs(per_host={"procs": 2}, name="k8s-gc")
        assert list(procs.spawn("k8s-gc-probe", Probe).add.call(1, 2).get(timeout=20)) == [3, 3]
        owner = k8s.core.read_namespaced_secret(secret_name("it-gc"), k8s.namespace).metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid) == ("Pod", "it-gc-controller", ctl.metadata.uid)
        k8s.core.delete_namespaced_pod("it-gc-controller", k8s.namespace, grace_period_seconds=0)
        wait_for(lambda: run_objects(k8s, "it-gc") == [], 30, "the garbage collector removing the run")
        wait_for(lambda: len([e for e in events if e.kind == "died" and e.proc_mesh == "k8s-gc"]) == 2, 10,
                 "both procs dead")
        assert all("pod deleted" in e.reason for e in events if e.kind == "died" and e.proc_mesh == "k8s-gc")
    finally:
        cluster.close()


CRASHING_CONTROLLER = textwrap.dedent("""
    import os
    from rlmesh.launch.kubernetes import KubernetesCluster
    from k8s_actors import Probe
    cluster = KubernetesCluster(image="rlmesh-test:local", namespace={ns!r}, run="it-crash", kubeconfig={kc!r})
    procs = cluster.spawn_procs(per_host={{"procs": 2}}, name="k8s-gen")
    procs.spawn("k8s-crashy", Probe).add.call(1, 1).get(timeout=30)
    print("READY", flush=True)
    os._exit(9)  # a crash: no atexit, no cleanup
""")


def test_cleanup_after_a_controller_crash_leaves_nothing(k8s):
    here = os.path.dirname(__file__)
    code = CRASHING_CONTROLLER.format(ns=k8s.namespace, kc=str(k8s.plane.admin_kubeconfig))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert "READY" in out.stdout, out.stderr[-3000:]
    left = run_objects(k8s, "it-crash")
    assert len([o for o in left if o.startswith("pod/")]) == 2 and "secret/rlmesh-it-crash-secret" in left
    cli = subprocess.run([sys.executable, "-m", "rlmesh.cli", "k8s", "cleanup", "it-crash", "--namespace",
                          k8s.namespace, "--kubeconfig", str(k8s.plane.admin_kubeconfig), "--wait"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "2 pod(s)" in cli.stdout and "1 secret(s)" in cli.stdout
    assert run_objects(k8s, "it-crash") == []


IN_CLUSTER_CONTROLLER = textwrap.dedent("""
    import os
    import rlmesh as rm
    from rlmesh.launch.kubernetes import KubernetesCluster
    from k8s_actors import Probe
    with KubernetesCluster(image="rlmesh-test:local", namespace=os.environ["NS"], run="it-incluster") as cluster:
        procs = cluster.spawn_procs(per_host={"procs": 2}, name="k8s-inpod")
        probes = procs.spawn("k8s-inpod-probe", Probe)
        where = [probes.slice(procs=r).where.call_one().get(timeout=30) for r in range(2)]
        print("CONTROLLER", rm.actor.controller.Controller.current().addr, flush=True)
        print("RESULT", list(probes.add.call(1, 2).get(timeout=30)), flush=True)
        print("ADVERTISED", sorted(w["advertise"] for w in where), flush=True)
""")


def test_controller_in_a_pod_as_in_the_docs(k8s):
    """The docs' controller pod: binds 0.0.0.0, advertises its pod IP (downward API), owns the run."""
    env = [{"name": "RLMESH_BIND_HOST", "value": "0.0.0.0"},
           {"name": "RLMESH_ADVERTISE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "RLMESH_CONTROLLER_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "KUBECONFIG", "value": str(k8s.plane.admin_kubeconfig)},  # stands in for the SA token
           {"name": "NS", "value": k8s.namespace}, {"name": "RLMESH_TELEMETRY", "value": "0"}]
    k8s.core.create_namespaced_pod(k8s.namespace, {
        "metadata": {"name": "it-incluster-controller"},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "containers": [{"name": "controller", "image": IMAGE, "env": env,
                                 "command": ["python", "-c", IN_CLUSTER_CONTROLLER]}]}})
    def finished() -> str | None:
        phase = k8s.core.read_namespaced_pod("it-incluster-controller", k8s.namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, 60, "the controller pod finishing")
    log = (k8s.kubelet.log_dir / f"{k8s.namespace}_it-incluster-controller.log").read_text()
    statuses = k8s.core.read_namespaced_pod("it-incluster-controller", k8s.namespace).status.container_statuses
    ended = statuses[0].state.terminated if statuses else None  # exit code or signal: a silent failure says which
    assert phase == "Succeeded", f"{ended}\n{log[-3000:]}"
    ctl_ip = k8s.core.read_namespaced_pod("it-incluster-controller", k8s.namespace).status.pod_ip
    assert f"CONTROLLER tcp://{ctl_ip}:" in log
    assert "#c" in log.split("CONTROLLER ", 1)[1].splitlines()[0]  # bound off loopback (0.0.0.0): CurveZMQ
    assert "RESULT [3, 3]" in log
    advertised = ast.literal_eval(log.split("ADVERTISED ", 1)[1].splitlines()[0])
    assert len(set(advertised)) == 2 and ctl_ip not in advertised  # each worker its own pod IP
    assert run_objects(k8s, "it-incluster") == []  # the with-block cleaned up
    k8s.core.delete_namespaced_pod("it-incluster-controller", k8s.namespace, grace_period_seconds=0)
