"""What launchers learn from a proc's output: lines, logging records and stack dumps, handed to sinks.

Launchers (the local one reads FIFOs, the Kubernetes one reads the pod log API) turn
what a proc writes into :class:`ProcLine` and :class:`StackDump` values and call
:func:`emit_lines` / :func:`emit_stacks`. Higher layers register sinks without the
launchers importing them: telemetry stores them in the ``logs`` and ``stacks`` tables,
the terminal echo prints lines prefixed by mesh and rank. A sink must be quick (it
runs on the launcher's reader thread) and never raises into it.
"""

from __future__ import annotations

import time
import enum
import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)


class OutputStream(enum.StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"
    LOG = "log"  # a Python logging record


@dataclass(frozen=True)
class ProcMeta:
    """The proc (one incarnation) that wrote something."""

    proc_id: str
    proc_mesh: str
    rank: int
    incarnation: int
    host: str
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class ProcLine:
    """One line of stdout/stderr, or one logging record, of one proc."""

    ts: float
    proc: ProcMeta
    stream: OutputStream
    message: str
    level: str | None = None
    logger: str | None = None
    exception: str | None = None
    actor: str | None = None  # mesh[rank] of the actor that logged it (logging records inside an actor)

    def render(self) -> str:
        """The text a person sees for it (without the mesh/rank prefix)."""
        if self.stream != OutputStream.LOG:
            return self.message
        text = f"{self.level} {self.logger}: {self.message}"
        return f"{text}\n{self.exception}" if self.exception else text


@dataclass(frozen=True, slots=True)
class StackFrame:
    thread: str  # thread ident as faulthandler prints it, 0x...
    thread_name: str | None
    current: bool  # the thread faulthandler ran on (faulthandler: "Current thread"), usually the main one
    depth: int  # 0 = the frame executing now, 1 = its caller, ...
    function: str
    file: str
    line: int | None


@dataclass(frozen=True)
class StackDump:
    ts: float
    proc: ProcMeta
    reason: str
    frames: tuple[StackFrame, ...]


LineSink = Callable[[list[ProcLine]], None]  # called with the lines of one read, in order
StackSink = Callable[[StackDump], None]
_lock = threading.Lock()
_line_sinks: list[LineSink] = []
_stack_sinks: list[StackSink] = []


def add_line_sink(fn: LineSink) -> None:
    with _lock:
        if fn not in _line_sinks:
            _line_sinks.append(fn)


def add_stack_sink(fn: StackSink) -> None:
    with _lock:
        if fn not in _stack_sinks:
            _stack_sinks.append(fn)


def remove_sinks(*fns: Callable[..., None]) -> None:
    with _lock:
        for fn in fns:
            for sinks in (_line_sinks, _stack_sinks):
                if fn in sinks:
                    sinks.remove(fn)


def _deliver(sinks: list, value: object) -> None:
    for fn in sinks:
        try:
            fn(value)
        except Exception:  # noqa: BLE001 - one sink's failure must not stop the reader
            logger.debug("output sink %r failed", fn, exc_info=True)


def emit_lines(lines: list[ProcLine]) -> None:
    """Hand the lines of one read to every line sink (one call per sink, not one per line: cheaper)."""
    if lines:
        _deliver(_line_sinks, lines)


def emit_line(line: ProcLine) -> None:
    _deliver(_line_sinks, [line])


def emit_stacks(dump: StackDump) -> None:
    _deliver(_stack_sinks, dump)


def log_record_line(doc_text: str, proc: ProcMeta) -> ProcLine:
    """A ``log`` FIFO line (JSON, written by :class:`rlmesh.actor.stdio.PipeLogHandler`) as a :class:`ProcLine`."""
    try:
        doc = json.loads(doc_text)
        return ProcLine(ts=float(doc["ts"]), proc=proc, stream=OutputStream.LOG, message=str(doc.get("msg", "")),
                        level=doc.get("level"), logger=doc.get("logger"), exception=doc.get("exc"),
                        actor=doc.get("actor"))
    except (ValueError, KeyError, TypeError):

        return ProcLine(ts=time.time(), proc=proc, stream=OutputStream.STDERR, message=doc_text)


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')


def parse_faulthandler(text: str, names: dict[str, str] | None = None) -> list[StackFrame]:
    """Frames of a :mod:`faulthandler` all-threads dump (most recent call first, so depth 0 is innermost)."""
    frames: list[StackFrame] = []
    thread, current, depth, tname = "", False, 0, None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            thread, current, depth = m.group(2), m.group(1) == "Current thread", 0
            tname = m.group(3) or (names or {}).get(thread.lower()) or _lookup(names, thread)
            continue
        m = _FRAME.match(line)
        if m and thread:
            lineno = int(m.group(2)) if m.group(2).isdigit() else None
            frames.append(StackFrame(thread, tname, current, depth, m.group(3), m.group(1), lineno))
            depth += 1
    return frames


def _lookup(names: dict[str, str] | None, ident: str) -> str | None:
    if not names:
        return None
    try:
        return names.get(f"0x{int(ident, 16):016x}")
    except ValueError:
        return None
