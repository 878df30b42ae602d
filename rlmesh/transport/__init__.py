"""Bytes between processes: pyzmq sockets, pickle-5 framing with zero-copy buffers, auth.

This is the lowest layer of rlmesh. It knows nothing of actors: it turns Python
objects into lists of zmq frames (one pickle header plus one frame per large
tensor/array buffer), signs them, and refuses unsigned input before any
``pickle.loads`` can run.
"""

from rlmesh.transport.auth import AuthError, Authenticator, is_loopback_address
from rlmesh.transport.serialization import SerializationError, dumps, loads
from rlmesh.transport.sockets import bind_random, zmq_context

__all__ = [
    "AuthError",
    "Authenticator",
    "SerializationError",
    "bind_random",
    "dumps",
    "is_loopback_address",
    "loads",
    "zmq_context",
]
