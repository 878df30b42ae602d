"""A wiretap for tests: records every multipart message this process sends on any zmq socket.

Installed in the controller by the scenario and in each worker through a controller
plugin that adds ``tap:install`` to the worker plugins; frames go to ``$RLMESH_TEST_TAP_DIR/<pid>.tap``
as they leave, which is what an attacker sniffing the wire would hold.
"""

import os
import pickle
import threading

import zmq

from rlmesh.transport import sockets as _sockets

_orig = zmq.Socket.send_multipart
_orig_frame = _sockets._zmq_send  # rlmesh's hot paths send frame by frame (sockets.send_frames)
_parts = threading.local()  # the frames of the message this thread is sending through them
_lock = threading.Lock()
_file = None


def _as_bytes(part):
    return bytes(getattr(part, "bytes", None) or memoryview(part).cast("B"))


def install(info=None):
    global _file
    d = os.environ.get("RLMESH_TEST_TAP_DIR")
    if not d or _file is not None:
        return
    _file = open(os.path.join(d, f"{os.getpid()}.tap"), "ab")

    def send_multipart(self, msg_parts, *args, **kwargs):
        out = _orig(self, msg_parts, *args, **kwargs)
        _record(self, msg_parts)
        return out

    def send_frame(sock, frame, flags, *args):
        out = _orig_frame(sock, frame, flags, *args)
        parts = getattr(_parts, "frames", None)
        if parts is None:
            parts = _parts.frames = []
        parts.append(frame)
        if not flags & zmq.SNDMORE:  # the message's last frame
            _parts.frames = None
            _record(sock, parts)
        return out

    zmq.Socket.send_multipart = send_multipart
    _sockets._zmq_send = send_frame


def _record(sock, msg_parts):
    if _file is None:
        return
    try:
        record = (sock.getsockopt(zmq.TYPE), [_as_bytes(p) for p in msg_parts])
        with _lock:
            pickle.dump(record, _file)
            _file.flush()
    except Exception:
        pass


def controller_plugin(info=None):
    """Registered in the controller: every worker it launches installs the tap too."""
    return {"RLMESH_WORKER_PLUGINS": "tap:install"}


def uninstall():
    global _file
    zmq.Socket.send_multipart = _orig
    _sockets._zmq_send = _orig_frame
    if _file is not None:
        _file.close()
        _file = None


def read_all(d):
    """Every captured ``(socket type, frames)`` of every process, in send order per process."""
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            while True:
                try:
                    out.append(pickle.load(f))
                except (EOFError, pickle.UnpicklingError):
                    break
    return out
