"""recv_frames reads one whole multipart message as recv_multipart(copy=False) does, frame by frame
from each frame's ``more`` flag: the data plane's receive paths use it (half the cost per message)."""

import pytest
import zmq

from rlmesh.transport.sockets import recv_frames


@pytest.fixture
def pair():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://recv-frames")
    b.connect("inproc://recv-frames")
    yield a, b
    a.close(0)
    b.close(0)
    ctx.term()


def test_whole_messages_in_order_and_never_merged(pair):
    a, b = pair
    a.send_multipart([b"ident", b"", b"x" * 1000])
    a.send(b"single")
    a.send_multipart([b"1", b"2"])
    got = [[bytes(f) for f in recv_frames(b, zmq.NOBLOCK)] for _ in range(3)]
    assert got == [[b"ident", b"", b"x" * 1000], [b"single"], [b"1", b"2"]]
    a.send_multipart([b"p", b"q"])
    frames = recv_frames(b)  # blocking, as recv_multipart without NOBLOCK
    assert [type(f) for f in frames] == [zmq.Frame, zmq.Frame] and [f.more for f in frames] == [True, False]


def test_an_empty_socket_raises_again(pair):
    _, b = pair
    with pytest.raises(zmq.Again):
        recv_frames(b, zmq.NOBLOCK)
