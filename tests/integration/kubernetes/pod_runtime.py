"""What the fake kubelet computes for a pod without running it: the container's environment
(plain values, Secret references, downward-API fields) and the status / event bodies it reports."""

from __future__ import annotations

import base64
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def container_env(core: Any, pod: dict, c: dict, ip: str, node: str, home: Path,
                  pythonpath: list[str]) -> dict[str, str]:
    """The process environment a kubelet would give container ``c``; ``KeyError`` (with the kubelet's
    wording) when a referenced Secret or key is missing, which the caller reports as
    ``CreateContainerConfigError``. The "image" is this test environment: the venv's bin on PATH."""
    meta = pod["metadata"]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
           "HOSTNAME": meta["name"], "PYTHONPATH": os.pathsep.join(pythonpath)}
    fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
              "status.podIP": ip, "status.hostIP": "127.0.0.1", "spec.nodeName": node}
    secrets: dict[str, dict] = {}
    for e in c.get("env") or []:
        ref = e.get("valueFrom") or {}
        if "secretKeyRef" in ref:
            s = ref["secretKeyRef"]
            if s["name"] not in secrets:
                try:
                    secrets[s["name"]] = core.read_namespaced_secret(s["name"], meta["namespace"]).data or {}
                except Exception as exc:  # noqa: BLE001
                    raise KeyError(f'secret "{s["name"]}" not found ({exc})') from None
            if s["key"] not in secrets[s["name"]]:
                raise KeyError(f'couldn\'t find key {s["key"]} in Secret {s["name"]}')
            env[e["name"]] = base64.b64decode(secrets[s["name"]][s["key"]]).decode()
        elif "fieldRef" in ref:
            env[e["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        else:
            env[e["name"]] = e.get("value", "")
    return env


def status_body(pod: dict, phase: str, ip: str, state: dict, ready: bool = False,
                pod_level: dict | None = None) -> dict:
    """A pod status patch with one container in ``state`` (``running``/``waiting``/``terminated``)."""
    c = pod["spec"]["containers"][0]
    ips = {"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {}  # an empty pod IP is invalid
    return {"status": {
        "phase": phase, "hostIP": "127.0.0.1", "startTime": now(), **ips, **(pod_level or {}),
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now()}],
        "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                               "restartCount": 0, "state": state}]}}


def event_body(pod: dict, node: str, reason: str, message: str) -> dict:
    """A Warning event about ``pod`` from the kubelet of ``node``."""
    meta = pod["metadata"]
    return {"metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"], "apiVersion": "v1"},
            "reason": reason, "message": message, "type": "Warning", "count": 1,
            "firstTimestamp": now(), "lastTimestamp": now(), "source": {"component": "kubelet", "host": node}}
