"""What a pod's status means for its proc: still going, ended (how and why), or stuck.

Pure functions over the pod as a camelCase dict (what the API returns, what
``ApiClient.sanitize_for_serialization`` gives), so every case is unit-tested
without a cluster. The launcher's watch thread calls :func:`pod_outcome` on each
event and caches the answer for the controller's non-blocking ``poll()``.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from typing import Any

from rlmesh.launch.kubernetes.manifests import CONTAINER

# Container "waiting" reasons that will not fix themselves: the proc has failed.
# ErrImagePull is left out on purpose: the kubelet retries it once and then reports
# ImagePullBackOff, so a registry blip does not kill a proc.
FATAL_WAITING = {
    "ImagePullBackOff": "image pull failed",
    "ErrImageNeverPull": "image not present on the node and imagePullPolicy is Never",
    "InvalidImageName": "invalid image name",
    "CreateContainerConfigError": "container config error",
    "CreateContainerError": "container could not be created",
    "RunContainerError": "container could not be started",
}


@dataclass(frozen=True)
class Outcome:
    """``kind``: ``exited`` (the container ended), ``deleted``, ``failed`` (pod-level failure,
    eviction, fatal waiting state) or ``unschedulable`` (final only after a grace period)."""

    kind: str
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""

    def status(self) -> tuple[int | None, int | None, str]:
        """The ``(exit_code, signal, reason)`` a ``ProcHandle.poll()`` returns."""
        return self.exit_code, self.signal, self.reason


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER:
            return cs
    return {}


def _signal_of(term: dict[str, Any]) -> int | None:
    if term.get("signal"):
        return int(term["signal"])
    code = term.get("exitCode")
    if isinstance(code, int) and code > 128 and code - 128 < _signal.NSIG:  # shells and runtimes report 128+N
        return code - 128
    return None


def _terminated(term: dict[str, Any], pod: dict[str, Any]) -> Outcome:
    code = term.get("exitCode")
    why = term.get("reason") or ""
    if why == "OOMKilled":
        limit = ""
        for c in (pod.get("spec") or {}).get("containers") or []:
            if c.get("name") == CONTAINER:
                limit = ((c.get("resources") or {}).get("limits") or {}).get("memory", "")
        why = f"OOMKilled (memory limit {limit or 'of the node'}; raise launcher.meshes.<mesh>.memory)"
    elif why in ("Completed", "Error"):
        why = ""  # the exit code says it all
    if term.get("message"):
        why = f"{why}: {term['message']}" if why else term["message"]
    sig = _signal_of(term)
    return Outcome("exited", None if sig and code == 128 + sig else code, sig, why)


def pod_outcome(pod: dict[str, Any] | None, *, killed: bool = False) -> Outcome | None:
    """``None`` while the pod is pending or running normally, else what ended (or stalled) it.

    ``pod=None`` means the pod is gone from the API. ``killed``: the launcher itself deleted
    it (``ProcHandle.kill``), which words the reason differently from someone else's delete.
    """
    deleted_reason = "pod deleted by the launcher (kill)" if killed else (
        "pod deleted (kubectl delete, a node drain or the node controller)")
    if pod is None:
        return Outcome("deleted", None, _signal.SIGKILL if killed else None, deleted_reason)
    status = pod.get("status") or {}
    phase = status.get("phase")
    cs = _container(pod)
    term = (cs.get("state") or {}).get("terminated")
    if status.get("reason") == "Evicted":
        how = _terminated(term, pod) if term else Outcome("failed")
        return Outcome("failed", how.exit_code, how.signal, f"evicted: {status.get('message') or 'node pressure'}")
    if phase in ("Succeeded", "Failed"):
        if term:
            return _terminated(term, pod)
        why = ": ".join(x for x in (status.get("reason"), status.get("message")) if x)
        return Outcome("failed", None, None, f"pod {phase.lower()}" + (f" ({why})" if why else ""))
    if term:  # terminated container, phase not updated yet
        return _terminated(term, pod)
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return Outcome("deleted", None, None, deleted_reason)
    waiting = (cs.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in FATAL_WAITING:
        msg = waiting.get("message") or ""
        return Outcome("failed", None, None,
                       f"{FATAL_WAITING[waiting['reason']]} ({waiting['reason']}{': ' + msg if msg else ''})")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return Outcome("unschedulable", None, None,
                           f"unschedulable: {cond.get('message') or 'no node fits'}")
    return None


def format_events(events: list[dict[str, Any]], limit: int = 5) -> str:
    """The last ``limit`` warning events of a pod, ``; ``-separated (``Warning FailedScheduling: ...``).

    Normal events (Scheduled, Pulled, Started) are left out: they never explain a failure."""
    def when(e: dict[str, Any]) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")

    warnings = [e for e in events if e.get("type") != "Normal"]
    lines = [f"{e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}".strip()
             for e in sorted(warnings, key=when)[-limit:]]
    return "; ".join(lines)
