"""Heartbeats through shared memory, for the procs on the controller's own host.

Why: a heartbeat message costs the controller a zmq wake-up, a MAC check and a Python dispatch
(~180 µs of CPU, most of it in libzmq's I/O thread and the supervisor thread). At 1,000 procs
the supervisor already spaces beats out to one a second each, and still spent 18 % of a core
reading them while the run was idle. A proc on the controller's host does not need a message
to say it lives: it writes the time into its slot of a shared board, and the supervisor reads
the whole board once per tick. Reading 1,000 slots is one copy of 8 KB.

When: the controller offers a board to launchers whose procs share its host (``same_host``:
the local launcher); a proc that cannot open it (another ``RLMESH_SHM_DIR``, another host)
beats by message as before, and so do pods. Only the heartbeat moves: hello, spawn replies,
the KV table and stop still travel on the authenticated control socket.

The board is a file in the shared-memory folder, mode 0600, one 8-byte slot per proc: the
``CLOCK_MONOTONIC`` second of its last beat (one clock for every process of a host). Its name
follows the weight slots' convention (``rlmesh-w-<job>-controller-<pid>-heartbeats``), so
:func:`rlmesh.weights.slots.reclaim_dead_segments` removes what a killed controller left.
An 8-byte aligned store is atomic on the hosts rlmesh runs on, so a reader never sees half a
time. Any process of the same user can write any slot; that user can already signal or ptrace
the procs, so the board adds no authority.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import time
from typing import Any

from rlmesh import settings

logger = logging.getLogger(__name__)

BOARD_ENV = settings.HB_BOARD.name
"""``<path>:<slot>``, set by the controller for a proc whose heartbeats go through the board."""
BOARD_OFF_ENV = settings.HB_BOARD_OFF.name
"""``1``: beat by message even on the controller's host (benchmarks, or a shm folder that is unsafe)."""
BOARD_EVERY = 4
"""The supervisor reads the board every this many ticks (0.2 s: the interval procs beat at)."""
SLOTS = 1 << 17
"""Slots per board (1 MiB of address space; tmpfs backs only the pages written)."""
_SLOT = struct.Struct("d")


class HeartbeatBoard:
    """The controller's side: creates the board, hands out slots, reads every slot at once."""

    def __init__(self, shm_dir: str, job_id: str) -> None:
        safe_job = re.sub(r"[^A-Za-z0-9_.]", "_", job_id)[:40]
        self.path = os.path.join(shm_dir, f"rlmesh-w-{safe_job}-controller-{os.getpid()}-heartbeats")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SLOTS * _SLOT.size)
            self._mm = mmap.mmap(fd, SLOTS * _SLOT.size)
        finally:
            os.close(fd)
        self._view = memoryview(self._mm).cast("d")
        self._next = 0
        self._free: list[int] = []
        self.procs: dict[int, Any] = {}
        """slot -> the controller's ``ProcRecord`` whose proc writes it"""

    @classmethod
    def create(cls, job_id: str) -> "HeartbeatBoard | None":
        """A board in ``RLMESH_SHM_DIR`` (``/dev/shm``), or ``None`` where it cannot be made or is turned off."""
        if settings.HB_BOARD_OFF.get():
            return None
        try:
            return cls(settings.SHM_DIR.get(), job_id)
        except OSError as exc:
            logger.info("no heartbeat board (%s): procs on this host beat by message", exc)
            return None

    def attach(self, rec: Any) -> str | None:
        """Give ``rec`` (a ``ProcRecord``) a slot, kept across its incarnations; the value of
        ``RLMESH_HB_BOARD`` for its proc, or ``None`` when the board is full (it beats by message)."""
        if rec.board_slot is None:
            rec.board_slot = self.allocate()
            if rec.board_slot is None:
                return None
            self.procs[rec.board_slot] = rec
        return self.env(rec.board_slot)

    def detach(self, rec: Any) -> None:
        """Free ``rec``'s slot (the controller forgot the proc)."""
        if rec.board_slot is not None and self.procs.pop(rec.board_slot, None) is rec:
            self.release(rec.board_slot)
        rec.board_slot = None

    def collect(self, live_states: tuple) -> None:
        """Fold the beats written since the last call into each proc's record, as a heartbeat message
        would (``last_hb`` and its :class:`~rlmesh.actor.supervision.HeartbeatMonitor`), for procs in
        ``live_states``. A beat is the writer's own monotonic time, so the gaps the failure detector
        learns are the proc's, not this reader's polling."""
        beats = self.read()
        for slot, rec in self.procs.items():
            t = beats[slot]
            if t > rec.last_hb and rec.state in live_states:
                rec.last_hb = t
                if rec.spawns_pending:
                    rec.hb.restart(t)
                else:
                    rec.hb.beat(t)

    def allocate(self) -> int | None:
        """A free slot, zeroed; ``None`` when all are taken (the proc then beats by message)."""
        if self._free:
            slot = self._free.pop()
        elif self._next < SLOTS:
            slot, self._next = self._next, self._next + 1
        else:
            return None
        self._view[slot] = 0.0
        return slot

    def release(self, slot: int) -> None:
        self._view[slot] = 0.0
        self._free.append(slot)

    def env(self, slot: int) -> str:
        return f"{self.path}:{slot}"

    def read(self) -> list[float]:
        """Every allocated slot's last beat (0.0: none yet), in one copy."""
        return self._view[:self._next].tolist()  # type: ignore[return-value]  # a cast('d') view: its items are floats

    def close(self) -> None:
        try:
            self._view.release()
            self._mm.close()
        except (BufferError, ValueError):
            pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class BoardSlot:
    """A worker's side: its one slot, written at every heartbeat."""

    def __init__(self, spec: str) -> None:
        path, _, slot = spec.rpartition(":")
        self.offset = int(slot) * _SLOT.size
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_uid != os.getuid():
                raise PermissionError(f"{path} belongs to another user")
            self._mm = mmap.mmap(fd, self.offset + _SLOT.size)
        finally:
            os.close(fd)

    @classmethod
    def from_env(cls) -> "BoardSlot | None":
        """The slot ``RLMESH_HB_BOARD`` names, or ``None`` (beat by message) if unset or not openable."""
        spec = settings.HB_BOARD.get()
        if not spec:
            return None
        try:
            return cls(spec)
        except (OSError, ValueError) as exc:
            logger.info("heartbeat board %s not usable (%s): beating by message", spec, exc)
            return None

    def beat(self) -> None:
        _SLOT.pack_into(self._mm, self.offset, time.monotonic())
