"""``breakpoint()`` in an endpoint: that actor pauses, and ``rlmesh debug`` attaches pdb to it remotely.

Why this shape: a worker has no terminal, and the actor's thread must stay paused while
everything else goes on (the proc keeps heartbeating on its control thread, other actors
and procs keep serving). So the worker's ``sys.breakpointhook`` binds a one-client zmq
socket where the proc binds its others (loopback, or its pod's address), announces where it
paused (a record in the debug directory ``RLMESH_DEBUG_DIR`` for local procs, mode 0600, and
a ``debug_sessions`` telemetry row through :func:`rlmesh.actor.hooks.set_debug_sink`, which
is how ``rlmesh debug`` on the controller's host finds an actor paused in a pod), and blocks
the actor's thread until a client attaches. Then a real :class:`pdb.Pdb` runs on that thread with its
stdin/stdout carried over the socket: every message is an rlmesh control message,
MAC-checked with the job secret before anything is unpickled, like all rlmesh traffic.
``continue`` resumes the actor and ends the session; ``quit`` raises ``BdbQuit`` in the
endpoint (the caller gets it as an ``ActorError``).

``PYTHONBREAKPOINT=0`` turns ``breakpoint()`` off in workers, as it does in Python.

Post-mortem: with ``RLMESH_POST_MORTEM=1`` an endpoint that raises pauses the same way,
in pdb at the frame that raised (:func:`post_mortem`), before its caller gets the error.
"""

from __future__ import annotations

import bdb
import dataclasses
import json
import logging
import os
import pdb
import socket
import sys
import threading
import time
from typing import Any

import zmq

from rlmesh import settings
from rlmesh.actor import hooks
from rlmesh.actor import protocol as P
from rlmesh.actor.context import current_context, current_proc
from rlmesh.transport.auth import Authenticator
from rlmesh.transport.sockets import bind_channel, tune, zmq_context

logger = logging.getLogger(__name__)

DEBUG_DIR_ENV = settings.DEBUG_DIR.name
POST_MORTEM_ENV = settings.POST_MORTEM.name
ATTACH, INPUT, OUTPUT, DETACHED = "dbg_attach", "dbg_in", "dbg_out", "dbg_end"


class _Channel:
    """The paused actor's end: one ROUTER socket, owned by the actor's thread."""

    def __init__(self) -> None:
        self.sock = tune(zmq_context().socket(zmq.ROUTER))
        self.addr, self.inbound = bind_channel(self.sock, Authenticator.from_env(), "debugger")
        self.peer: bytes | None = None
        self.out: Any = None  # the session answering the attached client
        self.pending = ""

    def _recv(self) -> tuple[bytes, str, dict, bytes]:
        while True:
            ident, *frames = self.sock.recv_multipart(copy=False)
            try:
                kind, msg, sid = P.read_control_session(self.inbound, frames)
            except Exception as exc:  # noqa: BLE001 - a bad MAC or a replay: ignore it, never unpickle it
                logger.warning("debugger: refused a message: %s", exc)
                continue
            return bytes(ident), kind, msg, sid  # type: ignore[call-overload]  # a zmq Frame is a buffer

    def _attached(self, ident: bytes, sid: bytes) -> None:
        self.peer, self.out = ident, self.inbound.reply_outbound(sid)

    def wait_attach(self) -> None:
        while self.peer is None:
            ident, kind, _, sid = self._recv()
            if kind == ATTACH:
                self._attached(ident, sid)

    def send(self, kind: str, **fields: Any) -> None:
        if self.peer is not None:
            self.sock.send_multipart([self.peer, *P.control(self.out, kind, **fields)], copy=False)

    def readline(self) -> str:
        while "\n" not in self.pending:
            ident, kind, msg, sid = self._recv()
            if kind == ATTACH:  # the client came back after losing its connection
                self._attached(ident, sid)
            elif ident == self.peer and kind == INPUT:
                self.pending += str(msg.get("data", ""))
        line, _, self.pending = self.pending.partition("\n")
        return line + "\n"

    def close(self) -> None:
        self.sock.close(200)


class _Stream:
    """File-like stdin/stdout for pdb over the channel."""

    def __init__(self, ch: _Channel):
        self.ch = ch

    def write(self, s: str) -> int:
        self.ch.send(OUTPUT, data=s)
        return len(s)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        return self.ch.readline()


class RemotePdb(pdb.Pdb):
    """pdb whose session ends (actor resumes, registration removed) on continue or quit."""

    def __init__(self, ch: _Channel, record: _Registration):
        stream = _Stream(ch)
        super().__init__(stdin=stream, stdout=stream, nosigint=True, readrc=False)  # type: ignore[arg-type]
        self.use_rawinput = False
        self.ch, self.record = ch, record
        self.ended = False
        self.prompt = "(Pdb) "

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.record.remove()
        self.ch.send(DETACHED)
        self.ch.close()

    def set_continue(self) -> None:
        super().set_continue()
        self._end()

    def set_quit(self) -> None:
        super().set_quit()
        self._end()


def _pause(frame: Any, reason: str) -> tuple[_Channel, _Registration]:
    """Register this actor as paused at ``frame`` (what ``rlmesh debug`` lists) and wait for a client."""
    ctx, proc = current_context(), current_proc()
    ch = _Channel()
    actor = ctx.actor_id if ctx else f"{proc.proc_id if proc else 'proc'}/main"
    pause = hooks.DebugPause(
        event="paused", actor=actor, mesh=ctx.mesh_name if ctx else None, rank=ctx.rank if ctx else None,
        proc=proc.proc_id if proc else None, host=socket.gethostname(), pid=os.getpid(), addr=ch.addr,
        file=frame.f_code.co_filename, line=frame.f_lineno, function=frame.f_code.co_name, reason=reason,
        since=time.time())
    reg = _Registration(pause)
    logger.warning("actor %s paused at %s in %s (%s:%d); attach with: rlmesh debug --attach %s",
                   actor, reason, pause.function, pause.file, pause.line, actor)
    ch.wait_attach()
    return ch, reg


class _Registration:
    """Where a pause is announced: a record file in the debug directory, when this proc has one
    (local procs: ``RLMESH_DEBUG_DIR`` is the run's ``debug/`` folder), and the debug sink
    (telemetry's ``debug_sessions`` table: how a pause on another host, a pod, is found)."""

    def __init__(self, pause: hooks.DebugPause):
        self.pause = pause
        self.record = ""
        d = settings.DEBUG_DIR.get()
        if d and _writable_dir(d):
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in pause.actor)
            self.record = os.path.join(d, f"{safe}.{os.getpid()}.{threading.get_ident()}.json")
            tmp = self.record + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({k: v for k, v in dataclasses.asdict(pause).items() if k != "event"}, f)
            os.replace(tmp, self.record)
        self._announce(pause)

    @staticmethod
    def _announce(pause: hooks.DebugPause) -> None:
        sink = hooks.debug_sink()
        if sink is not None:
            try:
                sink(pause)
            except Exception:  # noqa: BLE001 - the pause itself goes on
                logger.warning("debug sink failed", exc_info=True)

    def remove(self) -> None:
        if self.record:
            try:
                os.unlink(self.record)
            except OSError:
                pass
        self._announce(dataclasses.replace(self.pause, event="resumed", since=time.time()))


def _writable_dir(d: str) -> bool:
    """``d`` exists or can be made (a pod handed the controller's path makes it in its own filesystem,
    harmless: it then announces through the debug sink as well)."""
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        return True
    except OSError:
        return False


def breakpoint_hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` in workers: pause this actor until ``rlmesh debug`` attaches, then run pdb."""
    if os.environ.get("PYTHONBREAKPOINT", "") == "0":
        return
    frame = sys._getframe(1)
    ch, record = _pause(frame, "breakpoint()")
    RemotePdb(ch, record).set_trace(frame)


def post_mortem_enabled() -> bool:
    """``RLMESH_POST_MORTEM=1`` in a worker's environment (the controller's, or ``spawn_procs(env=...)``)."""
    return settings.POST_MORTEM.get()


def post_mortem(exc: BaseException) -> None:
    """Pause the calling actor in pdb at the frame that raised ``exc`` until ``rlmesh debug`` ends the session.

    Called by the actor server for an endpoint's exception when :func:`post_mortem_enabled`,
    on the actor's thread, before the caller is told: ``continue`` or ``quit`` lets the
    exception go on to the caller as usual. Only :class:`Exception` (not a ``quit`` from an
    earlier session, a cancellation or an exit).
    """
    tb = exc.__traceback__
    if tb is None or not isinstance(exc, Exception) or isinstance(exc, bdb.BdbQuit):
        return
    while tb.tb_next is not None:
        tb = tb.tb_next
    reason = f"exception {type(exc).__name__}: {exc}"[:300]
    ch, record = _pause(tb.tb_frame, reason)
    dbg = RemotePdb(ch, record)
    try:
        dbg.message(f"post-mortem: {type(exc).__name__}: {exc}  ('continue' lets it reach the caller)")
        dbg.reset()
        dbg.interaction(None, exc.__traceback__)
    finally:
        dbg._end()


def install() -> None:
    """Make ``breakpoint()`` in this worker pause the calling actor for a remote pdb."""
    sys.breakpointhook = breakpoint_hook
