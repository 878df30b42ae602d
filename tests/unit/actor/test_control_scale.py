"""What keeps the control plane cheap at 1,000 procs, as pure logic: heartbeats spaced out as N grows
(never past what the hang allowance can span), plain control messages that round-trip without the
out-of-band pickler, and a socket cap above zmq's default of 1,023."""

import pickle

import zmq

from rlmesh.actor import protocol as P
from rlmesh.actor.supervision import HB_BASE_S, HB_MAX_S, HeartbeatMonitor, heartbeat_interval
from rlmesh.transport.auth import Authenticator
from rlmesh.transport.channel import PREFIX_LEN
from rlmesh.transport.sockets import max_sockets, zmq_context


def test_heartbeat_interval_grows_with_n_within_bounds():
    assert heartbeat_interval(0) == heartbeat_interval(8) == heartbeat_interval(200) == HB_BASE_S
    assert HB_BASE_S < heartbeat_interval(500) < heartbeat_interval(900) < HB_MAX_S
    assert heartbeat_interval(1000) == heartbeat_interval(100_000) == HB_MAX_S
    # the total rate the controller reads stays near 1,000 beats a second from 200 to 1,000 procs
    for n in (200, 400, 1000):
        assert 900 <= n / heartbeat_interval(n) <= 1100


def test_slower_beats_widen_the_hang_allowance_instead_of_tripping_the_floor():
    hb = HeartbeatMonitor()
    t = 0.0
    for _ in range(20):
        hb.beat(t)
        t += HB_MAX_S
    assert hb.allowance(1.5, 8.0) >= 2 * HB_MAX_S  # a 1 s interval is never judged against the 1.5 s floor alone


def test_plain_control_kinds_travel_in_the_meta_and_round_trip():
    auth = Authenticator(b"k" * 32)
    inbound = auth.new_inbound("controller")
    out = auth.outbound("tcp://127.0.0.1:1#m" + inbound.nonce.hex())
    frames = P.control(out, P.DIRECTORY, up=[("m.1", "tcp://127.0.0.1:2#m00", 3)])
    body = bytes(frames[0])[PREFIX_LEN:]
    meta = pickle.loads(body[4:4 + int.from_bytes(body[:4], "little")])
    assert meta == (P.DIRECTORY, {"up": [("m.1", "tcp://127.0.0.1:2#m00", 3)]})  # no payload frame
    assert P.read_control(inbound, frames) == (P.DIRECTORY, {"up": [("m.1", "tcp://127.0.0.1:2#m00", 3)]})
    kind, msg = P.read_control(inbound, P.control(out, P.KV_REQ, op="put", key="k", value=b"x" * 10))
    assert (kind, msg["value"]) == (P.KV_REQ, b"x" * 10)  # other kinds keep the out-of-band payload


def test_socket_cap_is_above_zmqs_default_when_descriptors_allow():
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert zmq_context().get(zmq.MAX_SOCKETS) == max_sockets()
    assert max_sockets() >= 1023 and (soft < 2 * 1024 or max_sockets() > 1023)
