"""Simulated worker procs for benchmarks/control_plane_scale.py: many peers per OS process.

A *peer host* (``python benchmarks/_sim_peers.py``, started by :class:`SimLauncher`) runs
hundreds of peers on one thread. Each peer speaks the real protocol through the real
authenticated transport, exactly what the controller sees of a worker: its own control
DEALER (identity ``proc_id#incarnation``, ``HELLO``, a heartbeat every ``RLMESH_HEARTBEAT_S``,
``SPAWNED`` for each spawn request, ``BYE`` on ``STOP``) and its own data-plane ROUTER that
answers every call with a signed ``OK`` reply to the caller's inbox. What it does not do is run
actor code: a spawn is acknowledged, a call returns its first argument. So it measures the
controller (and the caller's gather), not Python start-up.

Commands come as JSON lines on stdin (``launch``, ``kill``, ``hang``); exits go back as JSON
lines on stdout, the way a pod watch reports a pod's end to the Kubernetes launcher.
"""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

import zmq

from rlmesh.actor import protocol as P
from rlmesh.actor.beats import BOARD_ENV, BoardSlot
from rlmesh.actor.controller import Controller
from rlmesh.transport.auth import AuthError, Authenticator
from rlmesh.transport.serialization import dumps, loads
from rlmesh.transport.sockets import bind_channel, connect_channel, tune, zmq_context


class _Peer:
    def __init__(self, host: "PeerHost", cmd: dict):
        self.proc_id, self.inc = cmd["proc_id"], cmd["incarnation"]
        ctx = zmq_context()
        self.ctl = tune(ctx.socket(zmq.DEALER))
        self.ctl.setsockopt(zmq.IDENTITY, f"{self.proc_id}#{self.inc}".encode())
        self.out = connect_channel(self.ctl, host.auth, cmd["controller"])
        self.replies = self.out.reply_inbound(f"controller messages to {self.proc_id}")
        self.data = tune(ctx.socket(zmq.ROUTER))
        # a peer on the controller's host binds its calls socket as a local proc does (a Unix socket on
        # Linux); one playing a pod on another host binds TCP
        self.addr, self.chan = bind_channel(self.data, host.auth, f"calls to {self.proc_id}", local=bool(cmd.get("board")))
        self.hung = False
        self.hb_s = host.hb_s
        # on the controller's host a worker beats into its board slot, as here (same class as a worker's)
        self.board = BoardSlot(cmd["board"]) if cmd.get("board") else None
        self.ctl.send_multipart(P.control(self.out, P.HELLO, proc_id=self.proc_id, incarnation=self.inc,
                                          pid=os.getpid(), host="sim", addr=self.addr))

    def close(self) -> None:
        self.ctl.close(0)
        self.data.close(0)


class PeerHost:
    def __init__(self) -> None:
        self.auth = Authenticator.from_env()
        self.hb_s = float(os.environ.get("RLMESH_HEARTBEAT_S", "0.2"))
        self.peers: dict[str, _Peer] = {}
        self.by_sock: dict[zmq.Socket, tuple[_Peer, bool]] = {}
        self.hb: list[tuple[float, str]] = []
        self.cmds: deque = deque()
        self.efd = os.eventfd(0, os.EFD_NONBLOCK)
        self.poller = zmq.Poller()
        self.poller.register(self.efd, zmq.POLLIN)
        self.inboxes: dict[str, tuple[zmq.Socket, Any]] = {}

    def _stdin(self) -> None:
        for line in sys.stdin:
            self.cmds.append(json.loads(line))
            os.eventfd_write(self.efd, 1)
        self.cmds.append({"op": "quit"})
        os.eventfd_write(self.efd, 1)

    def _report(self, proc_id: str, code: int | None, sig: int | None) -> None:
        sys.stdout.write(json.dumps({"exit": proc_id, "code": code, "signal": sig}) + "\n")
        sys.stdout.flush()

    def _end(self, proc_id: str, code: int | None, sig: int | None) -> None:
        p = self.peers.pop(proc_id, None)
        if p is None:
            return
        for s in (p.ctl, p.data):
            self.poller.unregister(s)
            self.by_sock.pop(s, None)
        p.close()
        self._report(proc_id, code, sig)

    def _command(self, c: dict) -> bool:
        op = c["op"]
        if op == "launch":
            p = _Peer(self, c)
            self.peers[p.proc_id] = p
            for s, is_ctl in ((p.ctl, True), (p.data, False)):
                self.poller.register(s, zmq.POLLIN)
                self.by_sock[s] = (p, is_ctl)
            heapq.heappush(self.hb, (time.monotonic() + self.hb_s, p.proc_id))
        elif op == "kill":
            self._end(c["proc_id"], None, 9)
        elif op == "hang" and c["proc_id"] in self.peers:
            self.peers[c["proc_id"]].hung = True
        return op != "quit"

    def _control(self, p: _Peer) -> None:
        while True:
            try:
                frames = p.ctl.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                kind, msg = P.read_control(p.replies, frames)
            except AuthError:
                continue
            if kind == P.SPAWN:
                p.ctl.send_multipart(P.control(p.out, P.SPAWNED, req=msg["req"], ok=True, error=None))
            elif kind == P.STOP:
                p.ctl.send_multipart(P.control(p.out, P.BYE, proc_id=p.proc_id))
                self._end(p.proc_id, 0, None)
                return
            elif kind == P.HANG:
                p.hung = True
            elif kind == P.HB_ACK and msg.get("hb_s") and p.board is None:
                p.hb_s = float(msg["hb_s"])  # as a worker does: the supervisor spaces beats out as N grows

    def _calls(self, p: _Peer) -> None:
        while True:
            try:
                frames = p.data.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if p.hung:
                continue
            try:
                meta, payload = P.decode_meta(p.chan, frames[1:])
            except AuthError:
                continue
            kind, call_id, _actor, _endpoint, _caller, inbox = meta
            args, _ = loads(payload)
            if kind != P.CALL:
                continue
            pair = self.inboxes.get(inbox)
            if pair is None:
                s = tune(zmq_context().socket(zmq.DEALER))
                pair = self.inboxes[inbox] = (s, connect_channel(s, self.auth, inbox))
            sock, session = pair
            sock.send_multipart(P.encode(session, (call_id, P.OK), dumps(args[0] if args else None)), copy=False)

    def run(self) -> None:
        threading.Thread(target=self._stdin, daemon=True).start()
        while True:
            now = time.monotonic()
            while self.hb and self.hb[0][0] <= now:
                _, pid_ = heapq.heappop(self.hb)
                p = self.peers.get(pid_)
                if p is None:
                    continue
                if p.hung:
                    pass
                elif p.board is not None:
                    p.board.beat()
                else:
                    p.ctl.send_multipart(P.control(p.out, P.HEARTBEAT, proc_id=p.proc_id))
                heapq.heappush(self.hb, (now + p.hb_s, pid_))
            wait = max(0.0, self.hb[0][0] - time.monotonic()) if self.hb else 0.5
            for s, _ in self.poller.poll(int(wait * 1000) + 1):
                if s == self.efd:
                    try:
                        os.eventfd_read(self.efd)
                    except BlockingIOError:
                        pass
                    while self.cmds:
                        if not self._command(self.cmds.popleft()):
                            return
                    continue
                entry = self.by_sock.get(s)
                if entry is not None:
                    (self._control if entry[1] else self._calls)(entry[0])


# ------------------------------------------------------------------------------ controller side
class SimHandle:
    """A simulated proc as the controller's launcher sees it: ``poll`` reads the exit its host reported."""

    pid = None

    def __init__(self, launcher: "SimLauncher", proc_id: str, host: int):
        self._l, self.proc_id, self.host = launcher, proc_id, host
        self.status: tuple[int | None, int | None, str] | None = None
        self.exited_at: float | None = None  # monotonic time its host's exit report arrived

    def poll(self) -> tuple[int | None, int | None, str] | None:
        return self.status

    def kill(self) -> None:
        if self.status is None:
            self._l.send(self.host, op="kill", proc_id=self.proc_id)

    def hang(self) -> None:
        self._l.send(self.host, op="hang", proc_id=self.proc_id)


class SimLauncher:
    """Starts ``hosts`` peer-host processes and places simulated procs on them round-robin.

    Create it after the controller exists (the peer hosts inherit the job secret)."""

    def __init__(self, hosts: int, same_host: bool = True):
        self.same_host = same_host  # peers beat through the controller's board (as local procs do), else by message
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.hosts = [subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=env) for _ in range(hosts)]
        self.handles: dict[str, SimHandle] = {}
        self._lock = threading.Lock()
        for i, h in enumerate(self.hosts):
            threading.Thread(target=self._read, args=(h,), daemon=True, name=f"sim-host-{i}").start()

    def send(self, host: int, **cmd: Any) -> None:
        with self._lock:
            self.hosts[host].stdin.write(json.dumps(cmd) + "\n")
            self.hosts[host].stdin.flush()

    def _read(self, h: subprocess.Popen) -> None:
        for line in h.stdout:
            msg = json.loads(line)
            handle = self.handles.get(msg["exit"])
            if handle is not None:
                handle.exited_at = time.monotonic()
                handle.status = (msg["code"], msg["signal"], "")
                Controller.notice_exit_if_open()  # as a launcher that sees exits does: poll now

    def launch(self, req: Any) -> SimHandle:
        host = req.rank % len(self.hosts)
        handle = self.handles[req.proc_id] = SimHandle(self, req.proc_id, host)
        self.send(host, op="launch", controller=req.controller_addr, proc_id=req.proc_id,
                  incarnation=req.incarnation, board=req.env.get(BOARD_ENV))
        return handle

    def close(self) -> None:
        for h in self.hosts:
            try:
                h.stdin.close()
            except OSError:
                pass
        for h in self.hosts:
            try:
                h.wait(5)
            except subprocess.TimeoutExpired:
                h.kill()


if __name__ == "__main__":
    PeerHost().run()
