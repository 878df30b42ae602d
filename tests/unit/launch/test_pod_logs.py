"""The pod log follower against a scripted log API: a stream cut while the proc runs is followed
again from its last line, without repeating lines (pure logic: no API server here; the real one
is in tests/integration/kubernetes/test_launch.py)."""

from __future__ import annotations

import threading

from rlmesh.launch import output
from rlmesh.launch.output import ProcMeta
from rlmesh.launch.pod_logs import PodLogFollower

META = ProcMeta("m.0", "m", 0, 0, "node")


class Stream:
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
            return Stream(["2026-12-03T10:00:00.000000001Z one", "2026-12-03T10:00:01.000000001Z two"])
        self.ended.set()
        return Stream(["2026-12-03T10:00:01.000000001Z two", "2026-12-03T10:00:02.000000001Z three"])


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
