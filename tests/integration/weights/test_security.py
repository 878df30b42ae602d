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
        for frames in (
            Authenticator(Authenticator.new_secret()).sign([json.dumps({"op": "latest", "rid": 1}).encode()]),  # wrong key
            [json.dumps({"op": "latest", "rid": 2}).encode()],  # no MAC at all
            [b"\x80\x05garbage-pickle", b"x"],
        ):
            s = ctx.socket(zmq.DEALER)
            s.connect(pub.record()["tcp"])
            s.send_multipart(frames)
            assert s.poll(500) == 0, "the server answered an unauthenticated request"
            s.close(0)
        assert pub._server.auth.rejected >= 2
        sub = Subscriber("sec", "tcp", directory=d)
        out, v = sub.pull()
        assert v == 1 and torch.equal(out["w"], torch.ones(4))
        sub.close()
