"""recv_frames reads one whole multipart message as recv_multipart(copy=False) does, frame by frame
from each frame's ``more`` flag: the data plane's receive paths use it (half the cost per message).
send_frames sends one as send_multipart(copy=False) does, through pyzmq's compiled send (a sixth of
the cost of its Python wrappers): whole messages, large frames zero-copy, non-buffers refused."""

import pytest
import zmq

from rlmesh.transport.sockets import recv_frames, send_frames


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


def test_send_frames_sends_whole_messages_as_send_multipart_does(pair):
    a, b = pair
    big = bytearray(b"y" * (1 << 20))  # over pyzmq's copy threshold: sent zero-copy, as with copy=False
    send_frames(a, [b"ident", b"", memoryview(big)])
    send_frames(a, [b"single"])
    a.send_multipart([b"after"])  # the two interleave with pyzmq's own sends on one socket
    got = [[bytes(f) for f in recv_frames(b)] for _ in range(3)]
    assert got == [[b"ident", b"", bytes(big)], [b"single"], [b"after"]]


def test_send_frames_refuses_a_frame_that_is_not_a_buffer_before_anything_leaves(pair):
    a, b = pair
    with pytest.raises(TypeError):
        send_frames(a, ["text is not bytes"])
    with pytest.raises(TypeError):
        send_frames(a, [b"head", memoryview(b"body"), "text"])
    send_frames(a, [b"next"])
    assert [bytes(f) for f in recv_frames(b)] == [b"next"]  # neither message left a frame behind
