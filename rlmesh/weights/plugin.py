"""Crash cleanup of shared-memory segments, run by the controller.

Why the controller: a publisher that exits cleanly unlinks its own segments (its
Publisher registers a worker shutdown hook and ``atexit``), but a SIGKILLed or
OOM-killed proc runs no code. The controller sees every death, so this plugin turns
``died`` / ``stopped`` / ``gave_up`` events into unlinks of that proc's segments (only
for procs on the controller's own host: a remote pod's ``/dev/shm`` goes with the
pod), withdraws the dead publisher's directory record, and removes whatever the job
left at controller exit. At its start it also reclaims segments of any earlier job whose
creating process is gone (a run killed outright, controller included, cleaned up nothing).

Register it with ``register_controller_plugin("rlmesh.weights.plugin:on_controller_start")``.
"""

from __future__ import annotations

import atexit
import logging
import socket
from typing import Any

from rlmesh.actor import kv
from rlmesh.actor.hooks import add_event_sink
from rlmesh.weights.directory import KEY_PREFIX
from rlmesh.weights.directory import this_job
from rlmesh.weights.slots import cleanup_segments, reclaim_dead_segments

logger = logging.getLogger(__name__)

_DEATH_KINDS = ("died", "stopped", "gave_up")
_state: dict[str, Any] = {}


def _withdraw_records(proc_id: str, pid: int | None) -> None:
    try:
        for key in kv.keys(KEY_PREFIX):
            try:
                rec = kv.get(key, 0)
            except KeyError:
                continue
            if isinstance(rec, dict) and rec.get("proc") == proc_id and (pid is None or rec.get("pid") == pid):
                kv.delete(key)
    except Exception:
        logger.debug("could not withdraw weight records of %s", proc_id, exc_info=True)


def make_sink(job: str, host: str) -> Any:
    """The event sink (separate for tests): unlink a dead proc's segments when it ran on ``host``."""

    def sink(ev: Any) -> None:
        if ev.kind not in _DEATH_KINDS:
            return
        if ev.host and ev.host != host:
            return
        cleanup_segments(job, ev.proc_id, ev.pid)
        _withdraw_records(ev.proc_id, ev.pid)

    return sink


def on_controller_start(info: Any) -> dict[str, str]:
    """Controller plugin: install the death sink and the exit-time sweep for this job."""
    job = this_job()
    host = getattr(info, "host", None) or socket.gethostname()
    reclaim_dead_segments()  # what runs killed outright (controller and all) left in /dev/shm
    if not _state.get(job):  # once per job: the plugins run again for each telemetry run
        _state[job] = True
        add_event_sink(make_sink(job, host))
        atexit.register(cleanup_segments, job)
    logger.debug("weights cleanup plugin installed for job %s on %s", job, host)
    return {}
