"""``breakpoint()`` in an endpoint: that actor pauses, and ``rlmesh debug`` attaches pdb to it remotely.

Why this shape: a worker has no terminal, and the actor's thread must stay paused while
everything else goes on (the proc keeps heartbeating on its control thread, other actors
and procs keep serving). So the worker's ``sys.breakpointhook`` binds a one-client zmq
socket on loopback, writes a small record of where it paused into the debug directory
(``RLMESH_DEBUG_DIR``, set by the controller; mode 0600), and blocks the actor's thread
until a client attaches. Then a real :class:`pdb.Pdb` runs on that thread with its
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
import json
import logging
import os
import pdb
import sys
import tempfile
import threading
import time
from typing import Any

import zmq

from rlmesh.actor import protocol as P
from rlmesh.actor.context import current_context, current_proc
from rlmesh.transport.auth import Authenticator
from rlmesh.transport.sockets import bind_channel, tune, zmq_context

logger = logging.getLogger(__name__)

DEBUG_DIR_ENV = "RLMESH_DEBUG_DIR"
POST_MORTEM_ENV = "RLMESH_POST_MORTEM"
ATTACH, INPUT, OUTPUT, DETACHED = "dbg_attach", "dbg_in", "dbg_out", "dbg_end"


def debug_dir() -> str:
    """Where paused actors register: ``$RLMESH_DEBUG_DIR``, else a per-job folder under the temp dir."""
    d = os.environ.get(DEBUG_DIR_ENV) or os.path.join(tempfile.gettempdir(),
                                                      f"rlmesh-debug-{os.environ.get('RLMESH_JOB_ID', 'nojob')}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


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
            return bytes(ident), kind, msg, sid

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

    def __init__(self, ch: _Channel, record: str):
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
        try:
            os.unlink(self.record)
        except OSError:
            pass
        self.ch.send(DETACHED)
        self.ch.close()

    def set_continue(self) -> None:
        super().set_continue()
        self._end()

    def set_quit(self) -> None:
        super().set_quit()
        self._end()


def _pause(frame: Any, reason: str) -> tuple[_Channel, str]:
    """Register this actor as paused at ``frame`` (a record ``rlmesh debug`` lists) and wait for a client."""
    ctx, proc = current_context(), current_proc()
    ch = _Channel()
    actor = ctx.actor_id if ctx else f"{proc.proc_id if proc else 'proc'}/main"
    info = {"actor": actor, "mesh": ctx.mesh_name if ctx else None, "rank": ctx.rank if ctx else None,
            "proc": proc.proc_id if proc else None, "pid": os.getpid(), "addr": ch.addr,
            "file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name,
            "since": time.time(), "reason": reason}
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in actor)
    record = os.path.join(debug_dir(), f"{safe}.{os.getpid()}.{threading.get_ident()}.json")
    tmp = record + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, record)
    logger.warning("actor %s paused at %s in %s (%s:%d); attach with: rlmesh debug --attach %s",
                   actor, reason, info["function"], info["file"], info["line"], actor)
    ch.wait_attach()
    return ch, record


def breakpoint_hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` in workers: pause this actor until ``rlmesh debug`` attaches, then run pdb."""
    if os.environ.get("PYTHONBREAKPOINT", "") == "0":
        return
    frame = sys._getframe(1)
    ch, record = _pause(frame, "breakpoint()")
    RemotePdb(ch, record).set_trace(frame)


def post_mortem_enabled() -> bool:
    """``RLMESH_POST_MORTEM=1`` in a worker's environment (the controller's, or ``spawn_procs(env=...)``)."""
    return os.environ.get(POST_MORTEM_ENV, "").strip().lower() in ("1", "true", "yes", "on")


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
