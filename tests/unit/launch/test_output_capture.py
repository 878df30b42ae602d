"""Pure logic of output capture: faulthandler parsing, rank ranges, terminal folding."""

import io
import time

from _support.waiting import wait_for
from rlmesh.launch.echo import TerminalEcho, rank_ranges
from rlmesh.launch.output import ProcLine, ProcMeta, OutputStream, log_record_line, parse_faulthandler

DUMP = """Thread 0x00007f1ad67fc6c0 (most recent call first):
  File "/usr/lib/python3.11/re/__init__.py", line 166 in match
  File "/app/actors.py", line 25 in stuck
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f1af1e23b80 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 468 in select
  File "<frozen runpy>", line ??? in _run_code
"""


def test_faulthandler_dump_becomes_frames_innermost_first_with_names():
    frames = parse_faulthandler(DUMP, {"0x00007f1ad67fc6c0": "worker-thread"})
    assert [(f.thread, f.depth, f.function) for f in frames] == [
        ("0x00007f1ad67fc6c0", 0, "match"), ("0x00007f1ad67fc6c0", 1, "stuck"),
        ("0x00007f1ad67fc6c0", 2, "_bootstrap"), ("0x00007f1af1e23b80", 0, "select"),
        ("0x00007f1af1e23b80", 1, "_run_code")]
    assert frames[1].file == "/app/actors.py" and frames[1].line == 25
    assert frames[0].thread_name == "worker-thread" and frames[3].thread_name is None
    assert not frames[0].current and frames[3].current
    assert frames[4].line is None  # faulthandler's ??? line


def test_rank_ranges():
    assert rank_ranges([3, 0, 1, 2, 7, 5]) == "0-3,5,7"
    assert rank_ranges([4]) == "4"


def _line(rank: int, text: str, stream: OutputStream = OutputStream.STDOUT) -> ProcLine:
    return ProcLine(time.time(), ProcMeta(f"p.{rank}", "p", rank, 0, "h"), stream, text)


def test_echo_folds_a_line_repeated_by_ranks_and_keeps_order():
    out, err = io.StringIO(), io.StringIO()
    echo = TerminalEcho(window=60, out=out, err=err)  # long window: nothing prints until flush()
    for r in range(4):
        echo([_line(r, "loading model")])
    echo([_line(2, "only me"), _line(1, "oops", OutputStream.STDERR)])
    assert out.getvalue() == ""
    echo.close()
    assert out.getvalue() == "[p[0-3] x4] loading model\n[p[2]] only me\n"
    assert err.getvalue() == "[p[1]] oops\n"


def test_echo_prints_each_group_after_its_window_and_sleeps_in_between():
    out, err = io.StringIO(), io.StringIO()
    echo = TerminalEcho(window=0.2, out=out, err=err)
    try:
        wait_for(lambda: not echo._holding.is_set(), 30, "the echo")  # nothing held: the thread sleeps until a line
        t0 = time.monotonic()
        echo([_line(0, "first"), _line(1, "first")])
        wait_for(lambda: out.getvalue() == "[p[0-1] x2] first\n", 30, "the echo")
        assert time.monotonic() - t0 >= 0.2  # held for the window, so other ranks could join
        wait_for(lambda: not echo._holding.is_set(), 30, "the echo")  # and asleep again once it is printed
        echo([_line(3, "second", OutputStream.STDERR)])  # a line after the idle sleep still comes out
        wait_for(lambda: err.getvalue() == "[p[3]] second\n", 30, "the echo")
    finally:
        echo.close()
    assert not echo._thread.is_alive()


def test_echo_without_window_prints_at_once_and_renders_records():
    out, err = io.StringIO(), io.StringIO()
    echo = TerminalEcho(window=0, out=out, err=err)
    rec = log_record_line('{"ts": 1.0, "level": "ERROR", "logger": "x", "msg": "bad", "exc": "Traceback\\nKeyError"}',
                          ProcMeta("p.0", "p", 0, 0, "h"))
    echo([rec])
    assert err.getvalue() == "[p[0]] ERROR x: bad\n[p[0]] Traceback\n[p[0]] KeyError\n"
    assert rec.stream == OutputStream.LOG and rec.exception == "Traceback\nKeyError"


def test_a_broken_log_line_is_kept_as_stderr_text():
    rec = log_record_line("not json", ProcMeta("p.0", "p", 0, 0, "h"))
    assert rec.stream == OutputStream.STDERR and rec.message == "not json"


def test_pod_log_timestamps_are_split_from_the_text():
    from rlmesh.launch.pod_logs import split_timestamp

    ts, text = split_timestamp("2026-12-03T09:45:07.250000000Z hello world")
    assert text == "hello world" and abs(ts - 1796291107.25) < 1e-6
    ts, text = split_timestamp("no stamp here")
    assert text == "no stamp here" and ts > 0


def test_lines_of_one_read_keep_their_order_in_distinct_microseconds():
    """The reader batches ~10 ms of output into one read: its lines must not share one ts, or "the last
    line before the death" is any of them (the integration test saw the replacement's earlier line)."""
    from rlmesh.launch import output
    from rlmesh.launch.capture import OutputCapture, _Proc, _Stream
    from rlmesh.telemetry.columnar import ts_array

    got: list[ProcLine] = []
    output.add_line_sink(got.extend)
    try:
        s = _Stream(_Proc("/nonexistent", "p.1", "p", 1, 1, "h"), "out", -1)
        OutputCapture._lines(None, s, [b"back after SIGKILL", b"last words of rank 1"])  # type: ignore[arg-type]
        OutputCapture._lines(None, s, [b"one more"])  # type: ignore[arg-type]
    finally:
        output.remove_sinks(got.extend)
    assert [ln.message for ln in got] == ["back after SIGKILL", "last words of rank 1", "one more"]
    assert all(ln.proc.incarnation == 1 for ln in got)
    us = ts_array([ln.ts for ln in got]).cast("int64").to_pylist()  # what the logs table stores
    assert us == sorted(set(us)) and abs(got[0].ts - time.time()) < 5
