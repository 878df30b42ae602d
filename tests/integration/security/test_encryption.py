"""Off loopback every connection is CurveZMQ: encrypted on the wire, and a peer without the job's keys is refused.

Tested on loopback by forcing the secure mode (``RLMESH_TRANSPORT_ENCRYPTION=always``),
and off loopback on this machine's own non-loopback address when it has one. What
crosses the wire is captured by a TCP proxy between the two sockets.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading

import psutil
import pytest
import zmq

from rlmesh.transport import AuthError, Authenticator, bind_channel, connect_channel
from rlmesh.transport.sockets import tune

pytestmark = pytest.mark.timeout(300)
MARKER = b"PLAINTEXT-MARKER-4f1c9"


class RecordingProxy:
    """Forwards TCP connections to ``target`` and keeps every byte the clients sent.

    :meth:`close` ends its threads before it returns: a zmq socket reconnects on its own, so
    a connection may arrive after the test is done with the proxy, and its thread must
    neither outlive the test nor raise (pytest then blames whichever test runs next).
    """

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = bytearray()
        self.lock = threading.Lock()
        self.closed = False
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                server.settimeout(None)
            except OSError:  # the target is gone (the test closed it): drop this late connection
                client.close()
                continue
            with self.lock:
                if self.closed:
                    client.close()
                    server.close()
                    return
                self.conns += [client, server]
                for src, dst, record in ((client, server, True), (server, client, False)):
                    t = threading.Thread(target=self._pump, args=(src, dst, record), daemon=True)
                    self.threads.append(t)
                    t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    with self.lock:
                        self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            conns = list(self.conns)
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (closing the fd alone does not)
        except OSError:
            pass
        self.listener.close()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in list(self.threads):
            t.join(10)
        for s in conns:
            s.close()


def _send_through_proxy(auth: Authenticator, secure: bool, monkeypatch) -> tuple[bytes, bytes]:
    monkeypatch.setenv("RLMESH_TRANSPORT_ENCRYPTION", "always" if secure else "auto")
    ctx = zmq.Context.instance()
    server = tune(ctx.socket(zmq.ROUTER))
    addr, inbound = bind_channel(server, auth, "test")
    assert addr.split("#")[1][0] == ("c" if secure else "m")
    assert server.getsockopt(zmq.MECHANISM) == (zmq.CURVE if secure else zmq.NULL)
    port = int(addr.partition("#")[0].rsplit(":", 1)[1])
    proxy = RecordingProxy(port)
    client = tune(ctx.socket(zmq.DEALER))
    out = connect_channel(client, auth, addr.replace(f":{port}#", f":{proxy.port}#"))
    client.send_multipart(out.sign_packed(MARKER, [MARKER * 5000]))  # a small frame and a large one
    assert server.poll(30_000), "the message did not arrive"
    frames = server.recv_multipart(copy=False)
    _, body, extra = inbound.verify_packed(frames[1:])
    for s in (client, server):
        s.close(0)
    proxy.close()
    return bytes(body), bytes(proxy.seen)


def test_forced_secure_mode_leaves_no_plaintext_on_the_wire(monkeypatch):
    auth = Authenticator(Authenticator.new_secret())
    body, wire = _send_through_proxy(auth, secure=False, monkeypatch=monkeypatch)
    assert body == MARKER and MARKER in wire  # the capture works: loopback MAC mode is readable
    body, wire = _send_through_proxy(auth, secure=True, monkeypatch=monkeypatch)
    assert body == MARKER and len(wire) > 5000 * len(MARKER)
    assert MARKER not in wire and MARKER[:8] not in wire, "CurveZMQ traffic carried plaintext"


def _send_if_it_can(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send without blocking. A peer whose handshake the server already refused can have no pipe
    left to queue on, and a blocking send then waits forever (it hung a clean run for 300 s);
    a message that cannot even leave is refused too."""
    with contextlib.suppress(zmq.Again):
        sock.send_multipart(frames, flags=zmq.NOBLOCK)


def test_a_peer_without_the_keys_is_refused(monkeypatch):
    monkeypatch.setenv("RLMESH_TRANSPORT_ENCRYPTION", "always")
    auth = Authenticator(Authenticator.new_secret())
    ctx = zmq.Context.instance()
    server = tune(ctx.socket(zmq.ROUTER))
    addr, inbound = bind_channel(server, auth, "test")
    endpoint = addr.partition("#")[0]
    plain = tune(ctx.socket(zmq.DEALER))  # no CURVE at all
    plain.connect(endpoint)
    _send_if_it_can(plain, [b"hello"])
    stranger = tune(ctx.socket(zmq.DEALER))  # CURVE, knows the server's public key, but not the job's client key
    pub, sec = zmq.curve_keypair()
    stranger.curve_serverkey, stranger.curve_publickey, stranger.curve_secretkey = (
        auth.curve_keys().server_public, pub, sec)
    stranger.connect(endpoint)
    _send_if_it_can(stranger, [b"hello"])
    other_job = tune(ctx.socket(zmq.DEALER))  # another job's keys: derives another server key
    connect_channel(other_job, Authenticator(Authenticator.new_secret()), addr)
    _send_if_it_can(other_job, [b"hello"])
    member = tune(ctx.socket(zmq.DEALER))
    out = connect_channel(member, auth, addr)
    member.send_multipart(out.sign_packed(b"member", []))
    assert server.poll(30_000)
    frames = server.recv_multipart(copy=False)
    assert bytes(inbound.verify_packed(frames[1:])[1]) == b"member"
    assert not server.poll(1000), "a peer without the job's keys got a message through"
    for s in (plain, stranger, other_job, member, server):
        s.close(0)


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_off_loopback_binds_are_curve_and_clear_dials_are_refused(monkeypatch):
    monkeypatch.delenv("RLMESH_TRANSPORT_ENCRYPTION", raising=False)
    auth = Authenticator(Authenticator.new_secret())
    sock = tune(zmq.Context.instance().socket(zmq.DEALER))
    with pytest.raises(AuthError, match="refusing to send in clear"):
        connect_channel(sock, auth, "tcp://10.1.2.3:5555#m" + "ab" * 16)
    sock.close(0)
    host = _non_loopback_ipv4()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    server = tune(zmq.Context.instance().socket(zmq.ROUTER))
    addr, _ = bind_channel(server, auth, "test", host=host)
    assert addr.startswith(f"tcp://{host}:") and "#c" in addr
    assert server.getsockopt(zmq.MECHANISM) == zmq.CURVE
    server.close(0)


RUNTIME = r"""
import json, rlmesh as rm
from rlmesh.actor.controller import Controller
from rlmesh.telemetry import api

class Echo(rm.Actor):
    @rm.endpoint
    async def echo(self, x):
        rm.telemetry.record("echoes", n=len(x))
        return x

    @rm.endpoint
    def flush(self):
        rm.telemetry.flush()

with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
    m = procs.spawn("echo", Echo)
    got = m.echo.call("x" * 100).get(timeout=120).values()
    m.flush.call().get(timeout=120)
    ctl = Controller.current()
    addrs = [ctl.addr, ctl.client.inbox_addr, api.service().ingest_addr, api.service().query_addr]
    addrs += [ctl.procs[p].addr for p in procs.proc_ids]
    import time
    deadline = time.monotonic() + 60

    def rows():
        try:
            return rm.telemetry.query("SELECT count(*) AS n FROM echoes").to_pylist()[0]["n"]
        except Exception:  # the table appears with its first batch
            return 0

    while (n := rows()) < 2:
        assert time.monotonic() < deadline, "telemetry rows did not arrive"
        time.sleep(0.05)
    print(json.dumps({"got": got, "addrs": addrs, "rows": n}))
"""


@pytest.mark.parametrize("mode", ["forced", "bind_host"])
def test_a_whole_run_works_encrypted(mode, tmp_path):
    env = {**os.environ, "RLMESH_RUNS_DIR": str(tmp_path), "RLMESH_HEARTBEAT_TIMEOUT_S": "60"}
    env.pop("RLMESH_SECRET", None)
    if mode == "forced":
        env["RLMESH_TRANSPORT_ENCRYPTION"] = "always"
    else:
        host = _non_loopback_ipv4()
        if host is None:
            pytest.skip("this machine has no non-loopback IPv4 address")
        env["RLMESH_BIND_HOST"] = host
    proc = subprocess.run([sys.executable, "-c", RUNTIME], env=env, capture_output=True, text=True, timeout=280)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1])
    assert r["got"] == ["x" * 100] * 2 and r["rows"] == 2
    assert all("#c" in a for a in r["addrs"]), f"a channel of the run is not CurveZMQ: {r['addrs']}"
