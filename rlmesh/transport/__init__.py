"""Bytes between processes: pyzmq sockets, pickle-5 framing with zero-copy buffers, auth.

This is the lowest layer of rlmesh. It knows nothing of actors: it turns Python
objects into lists of zmq frames (one pickle header plus one frame per large
tensor/array buffer), signs them with a per-channel key and a per-session counter,
and refuses forged or replayed input before any ``pickle.loads`` can run. Off
loopback every connection is CurveZMQ (encrypted and authenticated).
"""

from rlmesh.transport.auth import AuthError, Authenticator, is_loopback_address, split_address
from rlmesh.transport.channel import Inbound, Outbound
from rlmesh.transport.refusals import RefusalCounts, refusal_stats
from rlmesh.transport.serialization import SerializationError, dumps, loads
from rlmesh.transport.sockets import bind_channel, bind_random, connect_channel, zmq_context

__all__ = [
    "AuthError",
    "Authenticator",
    "Inbound",
    "Outbound",
    "RefusalCounts",
    "SerializationError",
    "bind_channel",
    "bind_random",
    "connect_channel",
    "dumps",
    "is_loopback_address",
    "loads",
    "refusal_stats",
    "split_address",
    "zmq_context",
]
