"""The publisher's socket answers only peers holding the job's secret, and never unpickles."""

import json

import pytest
import torch
import zmq

from rlmesh.actor.kv import LocalKV
from rlmesh.transport import Authenticator
from rlmesh.weights import Publisher, Subscriber


@pytest.mark.timeout(30)
def test_unauthenticated_requests_get_no_answer_and_do_not_stop_the_server():
    d = LocalKV()
    with Publisher("sec", directory=d) as pub:
        pub.publish({"w": torch.ones(4)}, version=1)
        ctx = zmq.Context.instance()
        addr = pub.record()["tcp"]
        for frames in (
            Authenticator(Authenticator.new_secret()).outbound(addr).sign(
                [json.dumps({"op": "latest", "rid": 1}).encode()]),  # wrong key
            [json.dumps({"op": "latest", "rid": 2}).encode()],  # no MAC at all
            [b"\x80\x05garbage-pickle", b"x"],
        ):
            s = ctx.socket(zmq.DEALER)
            s.connect(addr.partition("#")[0])
            s.send_multipart(frames)
            assert s.poll(500) == 0, "the server answered an unauthenticated request"
            s.close(0)
        assert pub._server._in.rejected >= 2
        sub = Subscriber("sec", "tcp", directory=d)
        out, v = sub.pull()
        assert v == 1 and torch.equal(out["w"], torch.ones(4))
        sub.close()


@pytest.mark.timeout(30)
def test_a_replayed_request_is_dropped_and_counted():
    """Before per-session counters, a captured ``open`` replayed from a new socket took another lease."""
    import os

    d = LocalKV()
    with Publisher("replay", directory=d) as pub:
        pub.publish({"w": torch.ones(4)}, version=1)
        addr = pub.record()["tcp"]
        ctx = zmq.Context.instance()
        auth = Authenticator(bytes.fromhex(os.environ["RLMESH_SECRET"]))
        request = auth.outbound(addr).sign([json.dumps({"op": "latest", "rid": 1}).encode()])
        answered = []
        for _ in range(3):  # the genuine send, then two replays of the same bytes from fresh sockets
            s = ctx.socket(zmq.DEALER)
            s.connect(addr.partition("#")[0])
            s.send_multipart(request)
            answered.append(s.poll(1000) != 0)
            s.close(0)
        assert answered == [True, False, False]
        assert pub._server._in.replayed == 2
