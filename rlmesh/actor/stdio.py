"""The worker's half of output capture: stdout/stderr, logging records and stack dumps go to the launcher's FIFOs.

Why FIFOs read by the launcher (not rows shipped by the proc itself): a proc that is
SIGKILLed cannot ship anything, but every byte it wrote before the kill is in the
kernel's pipe buffer, and the launcher side reads it after the death. So "what did
rank 3 print before it died" always has an answer.

The launcher sets ``RLMESH_CAPTURE_DIR`` to a private directory holding four FIFOs:

- ``out`` / ``err``: the proc's fd 1 and 2 (a plain ``Popen`` launch gets them at exec,
  so even an import error before this module runs is captured; a proc forked from the
  warm template gets them here, ``RLMESH_CAPTURE_STDIO=1``);
- ``log``: one JSON object per ``logging`` record (level, logger, message, exception
  text, the actor that logged it). The worker then has no stderr log handler: the
  controller renders records for the terminal, so a record is stored and shown once;
- ``stk``: Python stacks of every thread, written by :mod:`faulthandler` when the proc
  gets ``SIGUSR2``. faulthandler writes from its C signal handler without taking the
  GIL, so this works for a proc stuck in C code holding the GIL (the usual "hung"
  proc: its heartbeat thread cannot run either). A chained Python-level handler then
  adds thread names, when the main thread gets to run.

stdout and stderr are made line-buffered, so a line is in the pipe once printed.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from rlmesh import settings
from rlmesh.actor.context import ProcInfo, current_context

CAPTURE_DIR_ENV = settings.CAPTURE_DIR.name
CAPTURE_STDIO_ENV = settings.CAPTURE_STDIO.name  # "1": open out/err here and dup2 them onto fd 1/2
STACK_SIGNAL = signal.SIGUSR2
NAMES_MARK = "#rlmesh-thread-names "  # line after a faulthandler dump: {"<ident hex>": "name"}
FIFOS = ("out", "err", "log", "stk")

_stk_fd = -1


def _open_writer(path: str) -> int:
    """Open a FIFO for writing without blocking: fails at once (ENXIO) if the launcher is not reading."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    os.set_blocking(fd, True)  # writes block like on any pipe once it is full
    return fd


class PipeLogHandler(logging.Handler):
    """One JSON line per record on the ``log`` FIFO (written under the handler's lock: lines never interleave)."""

    def __init__(self, fd: int, proc: ProcInfo):
        super().__init__()
        self.fd = fd
        self.proc = proc

    def emit(self, record: logging.LogRecord) -> None:
        try:
            ctx = current_context()
            exc = None
            if record.exc_info:
                exc = logging.Formatter().formatException(record.exc_info)
            elif record.exc_text:
                exc = record.exc_text
            doc = {"ts": record.created, "level": record.levelname, "logger": record.name,
                   "msg": record.getMessage(), "exc": exc,
                   "actor": f"{ctx.mesh_name}[{ctx.rank}]" if ctx else None}
            data = (json.dumps(doc, default=str) + "\n").encode("utf-8", "replace")
            while data:
                n = os.write(self.fd, data)
                data = data[n:]
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


def _thread_names(signum: int, frame: Any) -> None:
    """Runs after faulthandler's dump (chained), in the main thread: names for the thread idents it printed."""
    if _stk_fd < 0:
        return
    names = {f"0x{t.ident:016x}": t.name for t in threading.enumerate() if t.ident is not None}
    try:
        os.write(_stk_fd, (NAMES_MARK + json.dumps(names) + "\n").encode())
    except OSError:
        pass


def attach(proc: ProcInfo, level: str) -> bool:
    """Route this worker's output to the launcher's FIFOs, if it set them up; returns whether it did.

    Call once, at worker start, before logging is configured otherwise.
    """
    global _stk_fd
    d = settings.CAPTURE_DIR.pop()  # popped: a nested controller must not write into ours
    dup_stdio = settings.CAPTURE_STDIO.pop()
    if not d or not os.path.isdir(d):
        return False
    try:
        if dup_stdio:
            sys.stdout.flush()
            sys.stderr.flush()
            for name, target in (("out", 1), ("err", 2)):
                fd = _open_writer(os.path.join(d, name))
                os.dup2(fd, target)
                os.close(fd)
        log_fd = _open_writer(os.path.join(d, "log"))
        _stk_fd = _open_writer(os.path.join(d, "stk"))
    except OSError as exc:
        print(f"rlmesh worker: output capture unavailable ({exc}); output goes to the inherited stdout/stderr",
              file=sys.stderr)
        return False
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # sys.stdout/stderr are TextIOWrappers  # a printed line is in the pipe, even if SIGKILL follows
        except (AttributeError, ValueError):
            pass
    root = logging.getLogger()
    root.setLevel(level)
    root.addHandler(PipeLogHandler(log_fd, proc))
    signal.signal(STACK_SIGNAL, _thread_names)
    faulthandler.register(STACK_SIGNAL, file=_stk_fd, all_threads=True, chain=True)
    return True
