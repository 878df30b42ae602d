"""A trainer mesh lives and dies as one: when any rank's proc dies, every rank restarts.

Why all of them: the ranks of a trainer mesh are one ``torch.distributed`` group, and a group
cannot take a new member. A rank that dies leaves its peers inside a collective (an all-gather,
the batch hand-off) that only ``trainer.group_timeout_s`` would end, and its replacement could
not join them anyway. So the controller kills the peers at once (:meth:`Controller.restart_proc`,
event ``restart_requested``), the supervisor restarts every rank under the mesh's restart policy,
and the new incarnations form a new group and load the newest checkpoint, sharded or not
(``Trainer.__init__``: the one-proc trainer's restart, on every rank). The buffer's lease and
cursor machinery gives back what the dead step had sampled, as for a one-proc trainer
(:mod:`rlmesh.rl.buffer`); generators go on generating within the bounded staleness meanwhile.

**Group epochs.** Each incident bumps the mesh's epoch, which the controller puts into the KV
under each rank's proc before any replacement starts; a rank forms its group at the rendezvous of
its epoch (:func:`group_epoch`, :meth:`rlmesh.rl.train.distributed.TrainGroup.form`), so no rank
ever dials a rendezvous (and a ``TCPStore``) of a group that is gone.

**Which deaths count.** A death of an incarnation of the current epoch starts an incident; the
deaths of the peers killed for it (older incarnations) do not start another. Nothing here judges
a proc dead: the supervisor's exit and heartbeat detection do, as for any proc.

This module imports no ``torch.distributed`` (the controller side runs it in the controller).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from rlmesh.actor import hooks, kv
from rlmesh.actor.context import current_proc
from rlmesh.actor.proc_state import ProcState

logger = logging.getLogger(__name__)

_KILLABLE = (ProcState.ALIVE, ProcState.STARTING, ProcState.REJOINING)
_links: dict[tuple[int, tuple[str, ...]], "RestartTogether"] = {}
_lock = threading.Lock()


def epoch_key(proc_id: str) -> str:
    """The KV key holding the group epoch of the trainer mesh on proc ``proc_id``."""
    return f"rlmesh.rl/train/epoch/{proc_id}"


def group_epoch() -> int:
    """This proc's trainer-mesh epoch (worker side): 0 before any incident, or where the procs were
    not linked with :func:`restart_together` (a test spawning a mesh directly)."""
    proc = current_proc()
    if proc is None:
        return 0
    try:
        return int(kv.get(epoch_key(proc.proc_id), timeout=0))
    except KeyError:
        return 0


class RestartTogether:
    """The controller's event sink for one trainer mesh's procs (in rank order)."""

    def __init__(self, controller: Any, proc_ids: list[str]) -> None:
        self.controller, self.proc_ids = controller, list(proc_ids)
        self.epoch = 0
        self.incidents = 0
        self.members = {p: controller.procs[p].incarnation for p in self.proc_ids}
        """The incarnation of each proc that belongs to the current epoch: a death of an older one is
        a peer killed for an incident already handled."""
        self._publish()

    def _publish(self) -> None:
        for p in self.proc_ids:
            self.controller.kv.put(epoch_key(p), self.epoch)

    def __call__(self, ev: hooks.ProcEvent) -> None:
        if self.controller.closed:
            hooks.remove_event_sink(self)
            return
        if ev.kind != "died" or ev.proc_id not in self.members or ev.incarnation < self.members[ev.proc_id]:
            return
        # On the supervisor thread, inside the death's handling: the dead proc is not relaunched yet,
        # so every replacement starts after the epoch below is in the KV.
        self.epoch += 1
        self.incidents += 1
        rank = self.proc_ids.index(ev.proc_id)
        self.members[ev.proc_id] = ev.incarnation + 1
        doomed = []
        for p in self.proc_ids:
            rec = self.controller.procs.get(p)
            if p == ev.proc_id or rec is None:
                continue
            if rec.state in _KILLABLE or rec.state in (ProcState.DEAD, ProcState.RESTARTING):
                self.members[p] = rec.incarnation + 1
            if rec.state in _KILLABLE:
                doomed.append(p)
        self._publish()
        why = (f"trainer mesh: rank {rank} ({ev.proc_id}) died; every rank restarts from the newest checkpoint "
               f"(group epoch {self.epoch})")
        logger.warning("%s", why)
        for p in doomed:
            self.controller.restart_proc(p, why, starting=True)


_GLOO_PEER_LOST = re.compile(r"gloo/transport/\w+/pair\.cc|Connection closed by peer|Connection reset by peer")


def peer_lost(exc: BaseException) -> bool:
    """``exc`` (an ``ActorError`` from a rank) is its collective failing because a peer's proc died:
    gloo sees the connection close within milliseconds, often before the supervisor has reaped the
    dead proc, so a mesh call can fail with this before it fails with ``ActorDied``."""
    kind = str(getattr(exc, "remote_type", "")).rsplit(".", 1)[-1]  # qualified: builtins.RuntimeError
    return kind in ("RuntimeError", "DistBackendError") and bool(_GLOO_PEER_LOST.search(str(getattr(exc, "message",
                                                                                                      exc))))


def restart_together(procs: Any) -> RestartTogether | None:
    """Link the procs of a trainer mesh (a ``ProcMesh`` slice, in the controller): from now on the
    death of any of them restarts all of them, each group formed at a new epoch. ``None`` for one
    proc (nothing to link) or outside a controller."""
    proc_ids = [procs._proc_ids[i] for i in procs._shape.indices]
    controller = getattr(procs, "_controller", None)
    if len(proc_ids) < 2 or controller is None:
        return None
    key = (id(controller), tuple(proc_ids))
    with _lock:
        link = _links.get(key)
        if link is not None and not controller.closed:
            return link
        for k, old in list(_links.items()):  # a closed controller's links, or older links over these procs
            if old.controller.closed or (k[0] == key[0] and set(k[1]) & set(proc_ids)):
                hooks.remove_event_sink(old)
                del _links[k]
        link = _links[key] = RestartTogether(controller, proc_ids)
    # the supervisor thread reads procs and the KV; the link is built before the sink can see an event
    hooks.add_event_sink(link)
    return link
