"""A wiretap for tests: records every multipart message this process sends on any zmq socket.

Installed in the controller by the scenario and in each worker through a controller
plugin that adds ``tap:install`` to the worker plugins; frames go to ``$RLMESH_TEST_TAP_DIR/<pid>.tap``
as they leave, which is what an attacker sniffing the wire would hold.
"""

import os
import pickle
import threading

import zmq

_orig = zmq.Socket.send_multipart
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
        if _file is not None:
            try:
                record = (self.getsockopt(zmq.TYPE), [_as_bytes(p) for p in msg_parts])
                with _lock:
                    pickle.dump(record, _file)
                    _file.flush()
            except Exception:
                pass
        return out

    zmq.Socket.send_multipart = send_multipart


def controller_plugin(info=None):
    """Registered in the controller: every worker it launches installs the tap too."""
    return {"RLMESH_WORKER_PLUGINS": "tap:install"}


def uninstall():
    global _file
    zmq.Socket.send_multipart = _orig
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
