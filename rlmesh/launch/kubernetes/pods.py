"""Pods as proc handles: a watch thread caches each pod's state so ``poll()`` never blocks.

The controller polls every proc handle every 50 ms on its supervisor thread, so a
handle must answer from memory. One :class:`PodWatcher` per run lists and then
watches the run's pods (label selector) and hands each event to the pod's
:class:`PodHandle`, which turns it into an exit status through
:func:`~rlmesh.launch.kubernetes.status.pod_outcome`. API writes (create, delete)
and slow reads (a failed pod's events) run on a small thread pool, never on the
supervisor thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Protocol

from rlmesh.launch.kubernetes.api import kubernetes_client
from rlmesh.launch.kubernetes.config import KubernetesConfig
from rlmesh.launch.kubernetes.status import Outcome, format_events, pod_outcome
from rlmesh.launch.pod_logs import shut_stream

logger = logging.getLogger(__name__)


class PodOwner(Protocol):
    """What a :class:`PodHandle` needs from the launcher that created its pod.

    Why a protocol: the launcher imports this module to make handles, so this module
    must not import the launcher back (``KubernetesLauncher`` satisfies it).
    """

    config: KubernetesConfig

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the launcher's API thread pool, never on the caller's thread."""

    def delete_pod(self, name: str) -> None:
        """Delete the pod ``name`` (already gone is fine)."""

    def pod_events(self, name: str) -> str:
        """The pod's recent events, formatted for an error message."""

    def pod_finished(self, handle: "PodHandle", out: Outcome) -> None:
        """The pod ended with ``out``: record it and remove the pod."""


class PodHandle:
    """One proc incarnation's pod, as the controller's supervisor sees it (``ProcHandle``)."""

    def __init__(self, launcher: PodOwner, name: str, proc_id: str):
        self.pid: int | None = None  # the worker's pid comes from its HELLO, not from here
        self.name = name
        self.proc_id = proc_id
        self._launcher = launcher
        self._status: tuple[int | None, int | None, str] | None = None
        self._lock = threading.Lock()
        self.killed = False
        self.created = False
        self._unschedulable: tuple[float, Outcome] | None = None
        self._finalizing = False

    # ---------------------------------------------------------------- ProcHandle
    def poll(self) -> tuple[int | None, int | None, str] | None:
        """Cached: ``None`` while the pod runs (or waits to), else ``(exit_code, signal, reason)``."""
        status = self._status
        if status is not None:
            return status
        stuck = self._unschedulable
        if stuck and not self._finalizing and \
                time.monotonic() - stuck[0] > self._launcher.config.unschedulable_timeout_s:
            self._finalizing = True
            self._launcher.submit(self._finish_with_events, stuck[1])
        return None

    def kill(self) -> None:
        """Delete the pod at once (grace 0); returns immediately, the watch reports the end."""
        self.killed = True
        self._launcher.submit(self._launcher.delete_pod, self.name)

    # ---------------------------------------------------------------- from the watch thread
    def observe(self, pod: dict[str, Any] | None) -> None:
        """A new state of the pod (``None``: it is gone from the API)."""
        if self._status is not None:
            return
        out = pod_outcome(pod, killed=self.killed)
        if out is None:
            self._unschedulable = None
            return
        if out.kind == "unschedulable":
            if self._unschedulable is None:
                self._unschedulable = (time.monotonic(), out)
            return
        if out.kind == "failed" and pod is not None:
            if not self._finalizing:
                self._finalizing = True
                self._launcher.submit(self._finish_with_events, out)
            return
        self.finish(out)

    def _finish_with_events(self, out: Outcome) -> None:
        events = self._launcher.pod_events(self.name)
        reason = f"{out.reason}; pod {self.name} events: {events}" if events else f"{out.reason} (pod {self.name})"
        self.finish(Outcome(out.kind, out.exit_code, out.signal, reason))

    def finish(self, out: Outcome) -> None:
        """Record the end once; the launcher then removes the finished pod."""
        with self._lock:
            if self._status is not None:
                return
            self._status = out.status()
        logger.info("pod %s (%s) ended: %s", self.name, self.proc_id, out.reason or f"exit {out.exit_code}")
        self._launcher.pod_finished(self, out)

    def __repr__(self) -> str:
        return f"<PodHandle {self.name} status={self._status}>"


class PodWatcher(threading.Thread):
    """List-then-watch the pods matching ``selector``; calls ``on_pod(name, pod_or_None)``.

    A watch that expires or breaks resumes from the last resource version; a 410
    (history compacted) relists, and ``on_relist(names)`` lets the launcher check
    pods that vanished while nobody watched.
    """

    watch_timeout_s = 45
    """Server-side length of one watch request; then it resumes from the last resource version."""

    def __init__(self, core: Any, namespace: str, selector: str, on_pod: Callable[[str, dict | None], None],
                 on_relist: Callable[[set[str]], None]):
        super().__init__(name=f"rlmesh-k8s-watch[{selector}]", daemon=True)
        self.core = core
        self.namespace = namespace
        self.selector = selector
        self.on_pod = on_pod
        self.on_relist = on_relist
        self.stopping = threading.Event()
        self.listed = threading.Event()
        self.error: BaseException | None = None
        self.resource_version = ""  # where the watch starts; "" = list first
        self._watch: Any = None

    def list_once(self) -> str:
        """List the run's pods, deliver each, return the list's resource version."""
        serialize = self.core.api_client.sanitize_for_serialization
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector, _request_timeout=30)
        names = set()
        for pod in pods.items:
            names.add(pod.metadata.name)
            self.on_pod(pod.metadata.name, serialize(pod))
        self.on_relist(names)
        self.listed.set()
        return pods.metadata.resource_version

    def run(self) -> None:
        k8s = kubernetes_client()
        ApiException = k8s.client.exceptions.ApiException
        serialize = self.core.api_client.sanitize_for_serialization
        rv = self.resource_version
        failures = 0
        while not self.stopping.is_set():
            try:
                if not rv:
                    rv = self.list_once()
                self._watch = k8s.watch.Watch()
                for ev in self._watch.stream(self.core.list_namespaced_pod, self.namespace,
                                             label_selector=self.selector, resource_version=rv,
                                             timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True,
                                             _request_timeout=self.watch_timeout_s + 15):
                    failures = 0
                    pod = ev["object"]
                    if ev["type"] == "BOOKMARK":
                        rv = pod.metadata.resource_version if hasattr(pod, "metadata") else rv
                        continue
                    if ev["type"] == "ERROR":
                        rv = ""
                        break
                    rv = pod.metadata.resource_version or rv
                    self.on_pod(pod.metadata.name, None if ev["type"] == "DELETED" else serialize(pod))
            except ApiException as exc:
                if self.stopping.is_set():
                    return
                if exc.status == 410:
                    rv = ""
                    continue
                failures += 1
                self.error = exc
                logger.warning("pod watch (%s) failed: HTTP %s %s; retrying", self.selector, exc.status, exc.reason)
                self.stopping.wait(min(5.0, 0.2 * 2 ** failures))
            except Exception as exc:  # connection reset, timeouts: resume
                if self.stopping.is_set():
                    return
                failures += 1
                logger.warning("pod watch (%s) broke: %s; retrying", self.selector, exc)
                self.stopping.wait(min(5.0, 0.2 * 2 ** failures))
                if failures > 3:
                    rv = ""  # relist, in case events were lost

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching and wait (up to ``timeout_s``) for the thread to end.

        Why wait: ``Watch.stop()`` only sets a flag that the stream reads after its next event,
        so the thread stayed inside the API call, blocked in a read, and woke on the events of the
        run's own pod deletions. A daemon thread that wakes inside a Kubernetes API call while the
        interpreter finalizes aborts the process (``rlmesh.launch.pod_logs`` says how). Shutting
        the open response's socket for reading ends that read now."""
        self.stopping.set()
        watch = self._watch
        if watch is not None:
            watch.stop()
            # the open watch response (kubernetes >= 29)
            shut_stream(getattr(watch, "_resp", None), f"pod watch ({self.selector}) response")
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)
            if self.is_alive():
                logger.warning("pod watch (%s) did not end within %.0f s of stop()", self.selector, timeout_s)


def describe_events(core: Any, namespace: str, pod: str) -> str:
    """The pod's recent events as one line, or '' (never raises: it only decorates a reason)."""
    try:
        evs = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}",
                                         _request_timeout=10)
        return format_events([core.api_client.sanitize_for_serialization(e) for e in evs.items])
    except Exception as exc:  # noqa: BLE001
        logger.debug("events of pod %s unavailable: %s", pod, exc)
        return ""
