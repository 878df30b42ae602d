"""The pod log follower against a scripted log API: a stream cut while the proc runs is followed
again from its last line, without repeating lines (pure logic: no API server here; the real one
is in tests/integration/kubernetes/test_launch.py)."""

from __future__ import annotations

import threading
import time

from rlmesh.launch import output
from rlmesh.launch.output import ProcMeta
from rlmesh.launch.pod_logs import PodLogFollower

META = ProcMeta("m.0", "m", 0, 0, "node")


class OutputStream:
    def __init__(self, lines: list[str]):
        self.data = "".join(f"{ln}\n" for ln in lines).encode()

    def stream(self, amt: int, decode_content: bool):
        yield self.data

    def release_conn(self) -> None:
        pass


class ScriptedLogAPI:
    """First call: two lines, then the stream is cut. Second: the API repeats what the
    ``since_seconds`` window holds (one line already read) and a new line; the proc has ended."""

    def __init__(self, ended: threading.Event):
        self.calls: list[dict] = []
        self.ended = ended

    def read_namespaced_pod_log(self, pod, namespace, **kw):
        self.calls.append(kw)
        if len(self.calls) == 1:
            return OutputStream(["2026-12-03T10:00:00.000000001Z one", "2026-12-03T10:00:01.000000001Z two"])
        self.ended.set()
        return OutputStream(["2026-12-03T10:00:01.000000001Z two", "2026-12-03T10:00:02.000000001Z three"])


def test_a_cut_stream_is_followed_again_without_repeating_lines():
    got: list[str] = []
    sink = lambda lines: got.extend(ln.message for ln in lines)  # noqa: E731
    output.add_line_sink(sink)
    ended = threading.Event()
    api = ScriptedLogAPI(ended)
    try:
        f = PodLogFollower(api, "ns", "pod-0", META, ended.is_set)
        f.start()
        f.join(30)
        assert not f.is_alive()
    finally:
        output.remove_sinks(sink)
    assert got == ["one", "two", "three"]
    assert "since_seconds" not in api.calls[0] and api.calls[1]["since_seconds"] >= 1


class NotFound(Exception):
    status = 404


class NoLogYetAPI:
    """The node has no log for the pod at first (404 through the API server's proxy), then it has;
    ``deleted``: the pod object itself is gone as well."""

    def __init__(self, deleted: bool):
        self.deleted = deleted
        self.log_calls = 0

    def read_namespaced_pod_log(self, pod, namespace, **kw):
        self.log_calls += 1
        if self.deleted or self.log_calls == 1:
            raise NotFound("the server could not find the requested resource (pods/log)")
        return OutputStream(["2026-12-03T10:00:00.000000001Z hello"])

    def read_namespaced_pod(self, pod, namespace, **kw):
        if self.deleted:
            raise NotFound("pods not found")
        return object()


def test_a_404_for_the_log_of_a_pod_that_exists_is_retried_and_one_that_is_gone_stops():
    got: list[str] = []
    sink = lambda lines: got.extend(ln.message for ln in lines)  # noqa: E731
    output.add_line_sink(sink)
    try:
        done = threading.Event()
        api = NoLogYetAPI(deleted=False)
        f = PodLogFollower(api, "ns", "pod-0", META, lambda: api.log_calls >= 2)
        f.start()
        f.join(30)
        assert not f.is_alive() and got == ["hello"] and api.log_calls == 2
        gone = NoLogYetAPI(deleted=True)
        f = PodLogFollower(gone, "ns", "pod-1", META, done.is_set)
        f.start()
        f.join(30)
        assert not f.is_alive() and gone.log_calls == 1  # the pod is gone: no second try
    finally:
        output.remove_sinks(sink)


class NeverALogAPI(NoLogYetAPI):
    """The pod exists but its container never starts: the follower retries, backing off."""

    def read_namespaced_pod_log(self, pod, namespace, **kw):
        self.log_calls += 1
        raise NotFound("the server could not find the requested resource (pods/log)")


def test_stop_ends_a_follower_that_is_waiting_to_retry():
    api = NeverALogAPI(deleted=False)
    f = PodLogFollower(api, "ns", "pod-2", META, lambda: False)
    f.start()
    deadline = time.monotonic() + 30
    while api.log_calls < 2:  # then it is in its back-off between tries
        assert time.monotonic() < deadline, "the follower did not retry"
        time.sleep(0.01)
    f.stop()
    calls = api.log_calls
    f.join(2.0)   # its back-off alone would keep it 0.75-5 s more, and it would retry for 10 min
    assert not f.is_alive()
    assert api.log_calls == calls   # no request once stop() has returned
