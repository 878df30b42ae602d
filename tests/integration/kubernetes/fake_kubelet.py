"""Plays the kubelet of one Node for the tests: runs each bound pod's container command as a
local process and reports its status back through the real API server.

What it honours, as a kubelet would: the container ``command``/``args``; ``env`` with
plain values, ``secretKeyRef`` (read from the API; a missing Secret is a
``CreateContainerConfigError``) and ``fieldRef`` (pod name, namespace, uid, pod IP,
node name, host IP); graceful deletion (SIGTERM, SIGKILL after the grace period, then
the final delete); exit codes (``Succeeded``/``Failed`` with the container's
``terminated`` state). Each pod gets its own loopback IP (127.0.1.N), so a worker that
did not take ``RLMESH_ADVERTISE_HOST`` from the downward API would advertise a wrong
address. Container logs: the node's kubelet endpoint (``daemonEndpoints``) is an HTTPS server here that
answers the API server's ``/containerLogs/<ns>/<pod>/<container>`` (``follow``, ``timestamps``)
from the container's output file, so ``read_namespaced_pod_log`` works end to end through the
real API server (which proxies it to the node, as for a real kubelet; stdout and stderr merged
and stamped when this kubelet reads them, not when written: close enough for the tests).
Images are not pulled: an image whose name starts with ``unpullable.`` fails
like a missing one (``ErrImagePull`` -> ``ImagePullBackOff`` and a ``Failed`` event);
any other image is "this test environment" (the venv's python, the test dir on
``PYTHONPATH``).
"""

from __future__ import annotations

import http.server
import itertools
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from pod_runtime import container_env, event_body, now, status_body

logger = logging.getLogger(__name__)


class _LogHandler(http.server.BaseHTTPRequestHandler):
    """``GET /containerLogs/<ns>/<pod>/<container>[?follow=true&timestamps=true]``, as a kubelet answers it."""

    kubelet: "FakeKubelet"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self.send_error(404)
            return
        _, ns, pod, _container = parts
        q = urllib.parse.parse_qs(url.query)
        follow, stamps = q.get("follow") == ["true"], q.get("timestamps") == ["true"]
        path = self.kubelet.log_dir / f"{ns}_{pod}.log"
        if not path.exists():  # as a kubelet answers for a container not started yet
            self.send_error(400, f"container of {ns}/{pod} is waiting to start: ContainerCreating")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        buf = b""
        with open(path, "rb") as f:
            while True:
                chunk = f.read(65536)
                if chunk:
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    out = b"".join((_stamp() if stamps else b"") + ln + b"\n" for ln in lines)
                    try:
                        self.wfile.write(out)
                        self.wfile.flush()
                    except OSError:
                        return
                    continue
                if not follow or self.kubelet.container_ended(ns, pod) or self.kubelet.stopping.is_set():
                    break
                time.sleep(0.05)
        if buf:
            try:
                self.wfile.write((_stamp() if stamps else b"") + buf + b"\n")
            except OSError:
                pass


def _stamp() -> bytes:
    t = time.time()
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z ").encode()


class FakeKubelet:
    def __init__(self, core: Any, node: str, log_dir: Path, pythonpath: list[str]):
        self.core = core
        self.node = node
        self.log_dir = log_dir
        self.pythonpath = pythonpath
        self.running: dict[str, subprocess.Popen] = {}  # pod uid -> process
        self.seen: set[str] = set()
        self.terminating: set[str] = set()
        self.gone: set[str] = set()
        self.forced: dict[str, dict] = {}  # pod uid -> how the node killed it (node_kill)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.ips = (f"127.0.1.{i}" for i in itertools.cycle(range(2, 250)))
        self.thread = threading.Thread(target=self._run, name="fake-kubelet", daemon=True)
        self.serialize = core.api_client.sanitize_for_serialization
        self.by_name: dict[tuple[str, str], subprocess.Popen] = {}  # (namespace, pod) -> its process
        self.log_server = self._log_server()

    def _log_server(self) -> http.server.ThreadingHTTPServer:
        """The kubelet's HTTPS endpoint (self-signed: the API server does not check a kubelet's certificate
        unless told --kubelet-certificate-authority)."""
        cert, key = self.log_dir / "kubelet.crt", self.log_dir / "kubelet.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
        handler = type("Handler", (_LogHandler,), {"kubelet": self})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name="fake-kubelet-logs", daemon=True).start()
        return server

    def container_ended(self, namespace: str, pod: str) -> bool:
        """Its process ran and exited (a log being followed ends then; not before it started)."""
        with self.lock:
            proc = self.by_name.get((namespace, pod))
        return proc is not None and proc.poll() is not None

    def register_node(self) -> None:
        from kubernetes import client

        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name=self.node, labels={"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"})))
        res = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        self.core.patch_node_status(self.node, {"status": {
            "capacity": res, "allocatable": res,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_server.server_address[1]}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake kubelet",
                            "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}})
        # The API server taints new nodes not-ready; the node lifecycle controller lifts that once the kubelet
        # reports Ready. That controller is not run here (it would want real kubelet heartbeats), so lift it.
        node = self.core.read_node(self.node)
        node.spec.taints = [t for t in node.spec.taints or [] if not t.key.startswith("node.kubernetes.io/")]
        self.core.replace_node(self.node, node)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            procs = list(self.running.values())
        for p in procs:
            _kill_group(p, signal.SIGKILL)
        self.log_server.shutdown()

    # ------------------------------------------------------------------ the watch loop
    def _run(self) -> None:
        from kubernetes import watch

        rv = ""
        while not self.stopping.is_set():
            try:
                if not rv:
                    pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}")
                    for pod in pods.items:
                        self._sync(self.serialize(pod), deleted=False)
                    rv = pods.metadata.resource_version
                for ev in watch.Watch().stream(self.core.list_pod_for_all_namespaces, resource_version=rv,
                                               field_selector=f"spec.nodeName={self.node}", timeout_seconds=30):
                    if self.stopping.is_set():
                        return
                    if ev["type"] == "ERROR":
                        rv = ""
                        break
                    rv = ev["object"].metadata.resource_version
                    self._sync(self.serialize(ev["object"]), deleted=ev["type"] == "DELETED")
            except Exception as exc:  # noqa: BLE001 - keep the node alive, like a kubelet
                if self.stopping.is_set():
                    return
                logger.warning("fake kubelet watch broke: %s", exc)
                rv = ""
                self.stopping.wait(0.5)

    def _sync(self, pod: dict, deleted: bool) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        with self.lock:
            proc = self.running.get(uid)
        if deleted:
            self.gone.add(uid)
            if proc is not None:
                _kill_group(proc, signal.SIGKILL)
            return
        if meta.get("deletionTimestamp"):
            if uid not in self.seen or proc is None or proc.poll() is not None:
                self._final_delete(pod)
            elif uid not in self.terminating:
                self.terminating.add(uid)
                grace = meta.get("deletionGracePeriodSeconds") or 0
                threading.Thread(target=self._terminate, args=(pod, proc, grace), daemon=True).start()
            return
        if uid in self.seen or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            return
        self.seen.add(uid)
        threading.Thread(target=self._start_pod, args=(pod,), daemon=True).start()

    # ------------------------------------------------------------------ pod lifecycle
    def _start_pod(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name = meta["namespace"], meta["name"]
        c = spec["containers"][0]
        if c["image"].startswith("unpullable."):
            self._image_pull_failure(pod, c)
            return
        ip = next(self.ips)
        try:
            env = self._env(pod, c, ip)
        except KeyError as exc:
            self._status(pod, "Pending", ip, {"waiting": {"reason": "CreateContainerConfigError",
                                                          "message": str(exc)}})
            return
        cmd = [*(c.get("command") or []), *(c.get("args") or [])]
        if cmd and cmd[0] in ("python", "python3"):
            cmd[0] = sys.executable  # the "image" is this test environment
        log = open(self.log_dir / f"{ns}_{name}.log", "wb")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.log_dir)
        with self.lock:
            self.running[meta["uid"]] = proc
            self.by_name[(ns, name)] = proc
        if meta["uid"] in self.gone:  # deleted while we were starting it
            _kill_group(proc, signal.SIGKILL)
        started = now()
        self._status(pod, "Running", ip, {"running": {"startedAt": started}}, ready=True)
        code = proc.wait()
        forced = self.forced.pop(meta["uid"], None)
        if code < 0:
            term = {"exitCode": 128 - code, "signal": -code, "reason": "Error"}
        else:
            term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        term.update(startedAt=started, finishedAt=now())
        if forced:  # the node killed it: OOM or eviction
            term.update(forced.get("terminated", {}))
        self._status(pod, "Succeeded" if code == 0 and not forced else "Failed", ip, {"terminated": term},
                     pod_level=(forced or {}).get("pod", {}))
        with self.lock:
            self.running.pop(meta["uid"], None)

    def node_kill(self, namespace: str, name: str, how: str) -> None:
        """Kill a running pod's process as the node would: ``oom`` (the container's memory limit) or
        ``evict`` (node pressure: the whole pod fails with reason Evicted)."""
        uid = self.core.read_namespaced_pod(name, namespace).metadata.uid
        if how == "oom":
            self.forced[uid] = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
        else:
            self.forced[uid] = {"terminated": {"reason": "Error", "exitCode": 137},
                                "pod": {"reason": "Evicted",
                                        "message": "The node was low on resource: memory. Container worker was "
                                                   "using 3Gi, which exceeds its request of 1Gi."}}
        with self.lock:
            proc = self.running[uid]
        _kill_group(proc, signal.SIGKILL)

    def _env(self, pod: dict, c: dict, ip: str) -> dict[str, str]:
        return container_env(self.core, pod, c, ip, self.node, self.log_dir, self.pythonpath)

    def _status(self, pod: dict, phase: str, ip: str, state: dict, ready: bool = False,
                pod_level: dict | None = None) -> None:
        body = status_body(pod, phase, ip, state, ready, pod_level)
        try:
            self.core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], body)
        except Exception as exc:  # noqa: BLE001 - the pod may be gone already
            logger.warning("status of %s not reported: %s", pod["metadata"]["name"], exc)

    def _image_pull_failure(self, pod: dict, c: dict) -> None:
        msg = f'rpc error: code = NotFound desc = failed to pull and unpack image "{c["image"]}": not found'
        self._event(pod, "Failed", f'Failed to pull image "{c["image"]}": {msg}')
        self._status(pod, "Pending", "", {"waiting": {"reason": "ErrImagePull", "message": msg}})
        self.stopping.wait(0.3)
        self._event(pod, "BackOff", f'Back-off pulling image "{c["image"]}"')
        self._status(pod, "Pending", "", {"waiting": {"reason": "ImagePullBackOff",
                                                      "message": f'Back-off pulling image "{c["image"]}"'}})

    def _event(self, pod: dict, reason: str, message: str) -> None:
        self.core.create_namespaced_event(pod["metadata"]["namespace"], event_body(pod, self.node, reason, message))

    def _terminate(self, pod: dict, proc: subprocess.Popen, grace: int) -> None:
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=max(grace, 0.1))
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
        self._final_delete(pod)

    def _final_delete(self, pod: dict) -> None:
        from kubernetes import client

        try:
            only_this = client.V1Preconditions(uid=pod["metadata"]["uid"])  # not a same-named successor
            self.core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                            body=client.V1DeleteOptions(grace_period_seconds=0,
                                                                        preconditions=only_this))
        except Exception as exc:  # noqa: BLE001 - gone already
            logger.debug("final delete of %s: %s", pod["metadata"]["name"], exc)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
