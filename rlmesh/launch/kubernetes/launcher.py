"""``KubernetesLauncher``: the controller's ``Launcher`` for pods, and its API calls.

``launch()`` runs on the controller's supervisor thread, so it only renders the
pod and queues the create on a small thread pool; creation failures come back
through the handle's ``poll()`` like any other death. The setup calls
(``ensure_secret``, ``validate``, ``start_watch``) run on the caller's thread
before the first launch, so configuration and RBAC errors are raised there, with
the fix, instead of surfacing as dead procs.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from typing import Any, Callable

from rlmesh import settings
from rlmesh.actor.controller import Controller, LaunchRequest
from rlmesh.launch.kubernetes.api import KubernetesError, explain
from rlmesh.launch.kubernetes.config import KubernetesConfig
from rlmesh.launch.kubernetes.manifests import (NOT_FORWARDED, PodProc, forwarded_env, owner_reference, pod_manifest,
                                                run_selector, secret_manifest, secret_name)
from rlmesh.launch.kubernetes.ops import cleanup_run
from rlmesh.launch.kubernetes.pods import PodHandle, PodWatcher, describe_events
from rlmesh.launch.kubernetes.status import Outcome
from rlmesh.launch import pod_logs
from rlmesh.launch.capture import capture_enabled
from rlmesh.launch.output import ProcMeta
from rlmesh.transport.auth import is_loopback_address

logger = logging.getLogger(__name__)
CONTROLLER_POD_ENV = settings.CONTROLLER_POD.name


class KubernetesLauncher:
    """``Launcher`` for the controller: ``launch(req)`` returns a :class:`PodHandle` at once."""

    def __init__(self, config: KubernetesConfig, core: Any, run: str):
        self.config = config
        self.core = core
        self.run = run
        self.owner: dict[str, Any] | None = None  # ownerReference to the run's Secret, once it exists
        self.secret_data: dict[str, str] = {}
        self.handles: dict[str, PodHandle] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="rlmesh-k8s")
        self._watcher: PodWatcher | None = None
        self._followers: list[pod_logs.PodLogFollower] = []  # one per created pod, while capture is on
        self._lock = threading.Lock()
        self._warned_loopback = False
        self.closed = False

    # ------------------------------------------------------------------ setup (caller's thread)
    def ensure_secret(self, data: dict[str, str]) -> None:
        """Create (or refresh) the run's Secret; its uid becomes the pods' owner."""
        ns = self.config.namespace
        owner = self._controller_pod_owner()
        body = secret_manifest(self.config, self.run, data, owner)
        try:
            try:
                obj = self.core.create_namespaced_secret(ns, body, _request_timeout=30)
            except Exception as exc:
                if getattr(exc, "status", None) != 409:
                    raise
                old = self.core.read_namespaced_secret(secret_name(self.run), ns, _request_timeout=30)
                body["metadata"]["resourceVersion"] = old.metadata.resource_version
                obj = self.core.replace_namespaced_secret(secret_name(self.run), ns, body, _request_timeout=30)
        except Exception as exc:
            raise explain(exc, f"creating Secret {secret_name(self.run)}", ns) from exc
        self.secret_data = dict(data)
        self.owner = owner_reference("Secret", obj.metadata.name, obj.metadata.uid)

    def _controller_pod_owner(self) -> dict[str, Any] | None:
        name = self.config.controller_pod or settings.CONTROLLER_POD.get()
        if not name:
            return None
        try:
            pod = self.core.read_namespaced_pod(name, self.config.namespace, _request_timeout=30)
        except Exception as exc:
            raise explain(exc, f"reading the controller's own pod {name!r} (launcher.controller_pod)",
                          self.config.namespace) from exc
        return owner_reference("Pod", name, pod.metadata.uid)

    def start_watch(self) -> None:
        """Start the run's pod watch (first list on this thread, so RBAC errors surface here)."""
        if self._watcher is not None:
            return
        w = PodWatcher(self.core, self.config.namespace, run_selector(self.run), self._on_pod, self._on_relist)
        try:
            w.resource_version = w.list_once()
        except Exception as exc:
            raise explain(exc, "listing pods", self.config.namespace) from exc
        self._watcher = w
        w.start()

    def validate(self, manifest: dict[str, Any]) -> None:
        """Server-side dry-run of a pod: admission, RBAC and schema, without creating anything."""
        try:
            self.core.create_namespaced_pod(self.config.namespace, manifest, dry_run="All", _request_timeout=30)
        except Exception as exc:
            raise explain(exc, f"creating pod {manifest['metadata']['name']} (server-side dry run)",
                          self.config.namespace) from exc

    def leftover_pods(self) -> list[str]:
        """Live pods with this run's label that this launcher did not create."""
        pods = self.core.list_namespaced_pod(self.config.namespace, label_selector=run_selector(self.run),
                                             _request_timeout=30)
        return [p.metadata.name for p in pods.items
                if p.metadata.name not in self.handles and not p.metadata.deletion_timestamp]

    def manifest(self, req: LaunchRequest) -> dict[str, Any]:
        env = {**forwarded_env(self.config, dict(os.environ)),
               **{k: v for k, v in req.env.items() if k not in NOT_FORWARDED}}
        proc = PodProc(req.proc_id, req.proc_mesh, req.rank, req.incarnation, req.controller_addr, env)
        return pod_manifest(self.config, self.run, proc, self.owner)

    # ------------------------------------------------------------------ Launcher (supervisor thread)
    def launch(self, req: LaunchRequest) -> PodHandle:
        if self.closed:
            raise KubernetesError("this KubernetesCluster is closed; create a new one")
        if is_loopback_address(req.controller_addr) and not self._warned_loopback:
            self._warned_loopback = True
            logger.warning("the controller listens on %s (loopback): pods on other nodes cannot dial it; set "
                           "RLMESH_BIND_HOST=0.0.0.0 and RLMESH_ADVERTISE_HOST=<pod IP or Service> for the "
                           "controller (docs/kubernetes.md)", req.controller_addr)
        stale = {k: req.env[k] for k in self.config.secret_env if k in req.env and
                 self.secret_data.get(k) != req.env[k]}
        if stale:  # a secret_env value appeared or changed since the Secret was made (rare): refresh it first
            self.ensure_secret({**self.secret_data, **stale})
        manifest = self.manifest(req)
        handle = PodHandle(self, manifest["metadata"]["name"], req.proc_id)
        handle.log_meta = ProcMeta(req.proc_id, req.proc_mesh, req.rank, req.incarnation, handle.name)  # type: ignore[attr-defined]  # read by pod_logs  # pod_logs
        with self._lock:
            self.handles[handle.name] = handle
        self.submit(self._create, handle, manifest)
        return handle

    def _create(self, handle: PodHandle, manifest: dict[str, Any]) -> None:
        if handle.killed:
            handle.finish(Outcome("deleted", None, None, "killed before its pod was created"))
            return
        try:
            self.core.create_namespaced_pod(self.config.namespace, manifest, _request_timeout=30)
        except Exception as exc:
            handle.finish(Outcome("failed", None, None,
                                  str(explain(exc, f"creating pod {handle.name}", self.config.namespace))))
            return
        handle.created = True
        if capture_enabled():  # the pod's output into the logs table, like a local proc's
            with self._lock:  # under the lock close() takes them with: none starts after close()
                if not self.closed:
                    self._followers = [t for t in self._followers if t.is_alive()]  # restarts add more
                    self._followers.append(pod_logs.follow(self.core, self.config.namespace, handle.name,
                                                           handle.log_meta, lambda: handle.poll() is not None))  # type: ignore[attr-defined]  # set in launch above
        if handle.killed:  # kill() raced the create
            self.delete_pod(handle.name)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the launcher's pool; exceptions are logged (callers do not wait)."""
        def run() -> None:
            try:
                fn(*args)
            except Exception:
                logger.exception("Kubernetes launcher task %s failed", getattr(fn, "__name__", fn))
        try:
            self._pool.submit(run)
        except RuntimeError:  # pool shut down at exit
            logger.debug("launcher closed; %s skipped", getattr(fn, "__name__", fn))

    def delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.config.namespace, grace_period_seconds=0,
                                            _request_timeout=30)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                logger.warning("deleting pod %s failed: %s", name, explain(exc, "deleting a pod",
                                                                          self.config.namespace))

    def pod_events(self, name: str) -> str:
        return describe_events(self.core, self.config.namespace, name)

    def pod_finished(self, handle: PodHandle, out: Outcome) -> None:
        """A pod's proc ended: remove the pod, unless it is gone or kept for ``kubectl logs``."""
        Controller.notice_exit_if_open()  # the supervisor polls every handle at once, not at its next sweep
        failed = out.kind != "exited" or out.exit_code != 0
        if out.kind != "deleted" and not (failed and self.config.keep_failed_pods):
            self.submit(self.delete_pod, handle.name)

    # ------------------------------------------------------------------ watch callbacks
    def _on_pod(self, name: str, pod: dict[str, Any] | None) -> None:
        with self._lock:
            handle = self.handles.get(name)
        if handle is None:
            return
        handle.observe(pod)
        if pod is None:
            with self._lock:
                self.handles.pop(name, None)  # gone from the API: nothing more will come for it

    def _on_relist(self, present: set[str]) -> None:
        with self._lock:
            missing = [h for n, h in self.handles.items() if n not in present and h.created and h.poll() is None]
        for h in missing:
            self.submit(self._recheck, h)

    def _recheck(self, handle: PodHandle) -> None:
        try:
            self.core.read_namespaced_pod(handle.name, self.config.namespace, _request_timeout=30)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                handle.observe(None)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Stop watching and delete the run's pods and Secret (synchronously, for exit paths)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            followers, self._followers = self._followers, []
        if self._watcher is not None:
            self._watcher.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            cleanup_run(self.core, self.config.namespace, self.run)
        except Exception as exc:  # noqa: BLE001 - at exit: say how to finish by hand
            logger.warning("cleaning up run %s failed (%s); run `rlmesh k8s cleanup %s --namespace %s`",
                           self.run, exc, self.run, self.config.namespace)
        # Threads inside API calls must end before the interpreter finalizes (pod_logs says why).
        pod_logs.stop_all(followers)
