"""A closed client never writes to its IO thread's eventfd again: the descriptor is closed with it, and its
number may already belong to another file. Real client (a zmq inbox on loopback), no procs."""

import os

from rlmesh.actor.client import Client
from rlmesh.actor.future import Future
from rlmesh.transport.auth import Authenticator


def test_wake_ups_after_close_write_nothing():
    client = Client(Authenticator(b"k" * 32), identity="test-close")
    efd = client._efd
    client.close()
    reused = os.eventfd(0, os.EFD_NONBLOCK)  # most likely the closed eventfd's number, reused
    try:
        client._io_parked = True  # as if the IO thread had parked just before the close (a race)
        client.wake_reader()  # a consumer added to a future of the closed client: nothing to wake
        Future(driver=client).add_done_callback(lambda f: None)
        if reused == efd:  # the number was reused: a stray write would show here as a count of 1
            try:
                assert os.eventfd_read(reused) == 0, "wrote to the closed client's eventfd number"
            except BlockingIOError:
                pass  # nothing written: what must happen
    finally:
        os.close(reused)
