"""Procs' output and stacks into the ``logs`` and ``stacks`` tables; the controller's own logging records too.

The launcher reads each proc's output (:mod:`rlmesh.launch.capture`, or the pod log
API on Kubernetes) and hands lines and stack dumps to the sinks registered here, on
its reader thread: lines are queued as they are (the flush thread makes each tick's lines
one columnar batch), a dump becomes one row per frame; a deque append, no I/O. The
controller's logging records (``rlmesh`` warnings, the user's own) are rows of the same
table with ``mesh='controller'``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from rlmesh.launch import output
from rlmesh.launch.output import ProcLine, StackDump
from rlmesh.telemetry import api

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

_installed = False
_lock = threading.Lock()


def lines_table(lines: list[ProcLine]) -> pa.Table:
    """The ``logs`` rows of one tick's lines (:func:`rlmesh.telemetry.log_table.lines_table`)."""
    from rlmesh.telemetry import log_table  # deferred: numpy + pyarrow; the flush thread loads them, not the start

    return log_table.lines_table(lines)


def record_lines(lines: list[ProcLine]) -> None:
    """Line sink: a deque append; the flush thread makes every line of a tick one columnar batch.

    (A dict per line, converted row by row, cost the controller ~15 µs a line; a table per
    read costs ~100 µs a read, too much for the small reads of a proc printing slowly.)
    """
    rec = api.active_recorder()
    if rec is None or not lines:
        return  # output of procs still stopping after the run ended: it must not start a run of its own
    rec.record_trusted_items("logs", lines, lines_table)


def record_stacks(dump: StackDump) -> None:
    """Stack sink: one ``stacks`` row per frame, all with one ``dump_id``."""
    p = dump.proc
    rec = api.active_recorder()
    if rec is None:
        return
    dump_id = uuid.uuid4().hex[:12]
    for f in dump.frames:
        rec.record_trusted("stacks", {
            "mesh": p.proc_mesh, "rank": p.rank, "proc": p.proc_id, "host": p.host,
            "incarnation": p.incarnation, "pid": p.pid, "dump_id": dump_id, "reason": dump.reason,
            "thread": f.thread, "thread_name": f.thread_name, "current": f.current, "depth": f.depth,
            "function": f.function, "file": f.file, "line": f.line,
        }, ts=dump.ts)


class ControllerLogHandler(logging.Handler):
    """The controller's ``rlmesh.*`` logging records as ``logs`` rows (stream ``log``, mesh ``controller``).

    Attached to the ``rlmesh`` logger, not the root: a root handler would turn the user's
    ``logging.basicConfig()`` into a no-op. Where it is the only handler a record meets, it
    also does what Python's last-resort handler would have done (WARNING and up to stderr),
    so the terminal shows what it showed before.
    """

    def _alone(self, record: logging.LogRecord) -> bool:
        lg: logging.Logger | None = logging.getLogger(record.name)
        while lg is not None:
            if any(h is not self for h in lg.handlers):
                return False
            lg = lg.parent if lg.propagate else None
        return True

    def emit(self, record: logging.LogRecord) -> None:
        last = logging.lastResort
        if last is not None and record.levelno >= last.level and self._alone(record):
            last.handle(record)
        if record.name.startswith("rlmesh.telemetry"):
            return  # the recorder's own complaints must not feed back into it
        try:
            exc = logging.Formatter().formatException(record.exc_info) if record.exc_info else None
            rec = api.active_recorder()
            if rec is None:
                return  # no run is going (it ended, or none started): a log line must not start one
            rec.record_trusted("logs", {
                "stream": "log", "level": record.levelname, "logger": record.name,
                "message": record.getMessage(), "exception": exc, "pid": record.process,
            }, ts=record.created)
        except Exception:  # noqa: BLE001
            self.handleError(record)


def install() -> None:
    """Register the sinks and the controller handler (once per process)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    output.add_line_sink(record_lines)
    output.add_stack_sink(record_stacks)
    logging.getLogger("rlmesh").addHandler(ControllerLogHandler())
