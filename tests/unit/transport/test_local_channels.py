"""Channels only this host dials (the actor data plane of local procs) bind a Linux abstract Unix socket:
real zmq sockets, a signed round trip over each kind of address, and every case that must stay on TCP."""

import sys

import pytest
import zmq

from rlmesh.transport import Authenticator
from rlmesh.transport.sockets import bind_channel, connect_channel, local_transport

AUTH = Authenticator(b"s" * 32)
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux-only")


def _send_hello(addr: str) -> zmq.Socket:
    """Send a signed ``hello`` from a fresh DEALER to the channel at ``addr``; returns the DEALER."""
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        out = connect_channel(dealer, AUTH, addr)
        dealer.send_multipart(out.sign_packed(b"hello", []))
        return dealer
    except BaseException:
        dealer.close(0)
        raise


def _bound(**kw):
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    addr, inbound = bind_channel(router, AUTH, "test", **kw)
    return router, addr, inbound


@linux
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_local_channel_binds_a_unix_socket_unless_told_tcp_and_carries_signed_messages(monkeypatch, transport):
    monkeypatch.delenv("RLMESH_BIND_HOST", raising=False)
    monkeypatch.setenv("RLMESH_LOCAL_TRANSPORT", transport)
    router, addr, inbound = _bound(local=True)
    try:
        assert addr.startswith("ipc://@rlmesh-" if transport == "ipc" else "tcp://127.0.0.1:")
        assert addr.split("#", 1)[1].startswith("m")  # MAC mode, nonce in the address, as on loopback TCP
        dealer = _send_hello(addr)
        try:
            assert router.poll(10_000), "no message arrived"
            frames = router.recv_multipart(copy=False)
            _, body, _ = inbound.verify_packed(frames[1:])
            assert bytes(body) == b"hello"
        finally:
            dealer.close(0)
    finally:
        router.close(0)


@linux
def test_a_bind_host_a_port_or_encryption_keeps_a_local_channel_on_tcp(monkeypatch):
    monkeypatch.delenv("RLMESH_LOCAL_TRANSPORT", raising=False)
    monkeypatch.delenv("RLMESH_BIND_HOST", raising=False)
    for kw, env in (({"host": "127.0.0.1"}, {}), ({}, {"RLMESH_BIND_HOST": "127.0.0.1"}),
                    ({}, {"RLMESH_TRANSPORT_ENCRYPTION": "always"})):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            router, addr, _ = _bound(local=True, **kw)
            router.close(0)
            assert addr.startswith("tcp://"), (kw, env, addr)
    router, addr, _ = _bound()  # not a local channel (the controller's, telemetry's): TCP as ever
    router.close(0)
    assert addr.startswith("tcp://127.0.0.1:")


def test_a_bad_local_transport_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv("RLMESH_LOCAL_TRANSPORT", "udp")
    with pytest.raises(ValueError, match="RLMESH_LOCAL_TRANSPORT='udp'.*'ipc'.*'tcp'"):
        local_transport()
