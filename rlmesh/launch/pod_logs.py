"""Kubernetes: a pod's output into the same sinks as local procs' (``logs`` table, terminal echo).

One daemon thread per pod follows the pod log API (``read_namespaced_pod_log(follow=True,
timestamps=True)``), from the moment the pod is created until its container ends; a stream cut
while the proc still runs is followed again from its last line's timestamp. The
API merges stdout and stderr, so lines arrive as ``stdout``; a worker in a pod logs its
records as plain lines (no FIFOs there). The kubelet keeps the container's log after a
crash, so the last lines of a killed pod are read as long as the pod object exists (the
launcher deletes finished pods; ``keep_failed_pods`` keeps failed ones).

The launcher stops its followers when it closes (:func:`stop_all`) and waits for them: a daemon
thread that comes back from a Kubernetes API call while the interpreter finalizes is ended by
``pthread_exit`` (Python 3.11), and glibc aborts the process when that forced unwinding fails,
as it did on such a thread's stack (most likely at pydantic-core's compiled Rust frames: the
kubernetes client runs every call inside its validator). That is how an ``rlmesh run`` on
Kubernetes sometimes ended with SIGABRT after its summary: a core dump showed a follower
returning from ``connect()`` to the log of a pod whose container had not started yet.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import Any, Callable

from rlmesh.launch import output
from rlmesh.launch.capture import ensure_echo
from rlmesh.launch.output import ProcLine, ProcMeta, OutputStream

logger = logging.getLogger(__name__)

START_WAIT_S = 600.0  # a pod may wait this long for its image and node before its log exists
# A log request's (connect, read) timeouts. The client takes no "no read timeout" beside a connect
# one, so a stream quiet for READ_TIMEOUT_S ends as if cut, and is followed again from its last line.
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 3600.0


def shut_stream(resp: Any, what: str) -> None:
    """Shut an open API response's socket for reading (urllib3 >= 2.3), so a thread blocked reading
    it returns now; ``None`` or a response already closed or released: nothing to do."""
    if resp is None:
        return
    try:
        resp.shutdown()
    except Exception as exc:  # noqa: BLE001 - released or closed already: its reader ends on its own
        logger.debug("%s already closed: %s", what, exc)


def split_timestamp(line: str) -> tuple[float, str]:
    """``2026-12-03T09:45:07.123456789Z text`` (the API's ``timestamps=True`` prefix) -> (epoch seconds, text)."""
    stamp, sep, text = line.partition(" ")
    if not sep or not stamp.endswith("Z"):
        return time.time(), line
    base, _, frac = stamp[:-1].partition(".")
    try:
        t = dt.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return time.time(), line
    return t + (float(f"0.{frac}") if frac.isdigit() else 0.0), text


class PodLogFollower(threading.Thread):
    """Follows one pod's log and emits its lines; ends when the log stream ends or ``gone()`` says so."""

    def __init__(self, core: Any, namespace: str, pod: str, meta: ProcMeta, gone: Callable[[], bool]):
        super().__init__(name=f"rlmesh-podlog-{pod}", daemon=True)
        self.core, self.namespace, self.pod, self.meta, self.gone = core, namespace, pod, meta, gone
        self.last_ts: float | None = None  # the newest line emitted: a re-follow skips what came before it
        self.stopping = threading.Event()
        self._resp: Any = None  # the open log stream, which stop() shuts

    def stop(self) -> None:
        """End the thread soon: no new request, and the open stream's socket shut for reading."""
        self.stopping.set()
        shut_stream(self._resp, f"pod log stream of {self.pod}")

    def run(self) -> None:
        deadline = time.monotonic() + START_WAIT_S
        other_errors, wait = 0, 0.5
        while time.monotonic() < deadline and not self.stopping.is_set():
            try:
                since = {} if self.last_ts is None else {"since_seconds": max(1, int(time.time() - self.last_ts) + 2)}
                resp = self.core.read_namespaced_pod_log(self.pod, self.namespace, follow=True, timestamps=True,
                                                         _preload_content=False,
                                                         _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S), **since)
            except Exception as exc:  # noqa: BLE001 - 400 while the container is being created; 404 once deleted
                status = getattr(exc, "status", None)
                if status not in (400, 404):
                    other_errors += 1
                # 404: the pod was deleted, or its node has no log for it yet (a container not
                # started, a kubelet that restarted): only the pod object itself tells which
                if self.stopping.is_set() or (status == 404 and not self._pod_exists()) or self.gone() \
                        or other_errors > 5:
                    logger.debug("not following the log of pod %s: %s", self.pod, exc)
                    return
                if self.stopping.wait(wait):
                    return
                wait = min(wait * 1.5, 5.0)
                continue
            self._resp = resp
            if self.stopping.is_set():  # stop() came while the request was being made
                resp.release_conn()
                return
            self._read(resp)
            self._resp = None
            if self.gone() or self.stopping.is_set():
                return  # the stream ended with the container: all its lines were read
            # The stream was cut while the proc lives (an API server or proxy timeout, a kubelet
            # restart): follow again from the last line read, as `kubectl logs -f` users do by hand.
            logger.debug("pod log of %s ended while its proc runs; following it again", self.pod)
            deadline, other_errors, wait = time.monotonic() + START_WAIT_S, 0, 0.5
            if self.stopping.wait(0.5):
                return

    def _pod_exists(self) -> bool:
        """False only when the API server says the pod object is gone (any other answer: it may exist)."""
        try:
            self.core.read_namespaced_pod(self.pod, self.namespace, _request_timeout=30)
        except Exception as exc:  # noqa: BLE001
            return getattr(exc, "status", None) != 404
        return True

    def _read(self, resp: Any) -> None:
        buf = b""
        try:
            for chunk in resp.stream(amt=65536, decode_content=True):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                self._emit(lines)
        except Exception as exc:  # noqa: BLE001 - the pod went away mid-stream
            logger.debug("pod log of %s ended: %s", self.pod, exc)
        finally:
            if buf:
                self._emit([buf])
            resp.release_conn()

    def _emit(self, raws: list[bytes]) -> None:
        out = []
        for raw in raws:
            ts, text = split_timestamp(raw.decode("utf-8", "replace").rstrip("\r"))
            if self.last_ts is not None and ts <= self.last_ts:
                continue  # read before the stream was cut (a re-follow starts a little early)
            self.last_ts = ts
            out.append(ProcLine(ts, self.meta, OutputStream.STDOUT, text))
        if out:
            output.emit_lines(out)


def follow(core: Any, namespace: str, pod: str, meta: ProcMeta, gone: Callable[[], bool]) -> PodLogFollower:
    """Start following ``pod``'s log (the terminal echo too, unless ``RLMESH_ECHO=0``)."""
    ensure_echo()
    t = PodLogFollower(core, namespace, pod, meta, gone)
    t.start()
    return t


def stop_all(followers: list[PodLogFollower], grace_s: float = 1.0, timeout_s: float = 5.0) -> None:
    """Let ``followers`` read what their streams still hold for up to ``grace_s``, then stop them and
    wait up to ``timeout_s`` more: none may be inside an API call when the interpreter finalizes."""
    deadline = time.monotonic() + grace_s
    for t in followers:
        t.join(max(0.0, deadline - time.monotonic()))
    for t in followers:
        t.stop()
    deadline = time.monotonic() + timeout_s
    for t in followers:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [t.pod for t in followers if t.is_alive()]
    if left:
        logger.warning("the log followers of pods %s did not end within %.0f s of being stopped", left, timeout_s)
