"""The local launcher's reader of its procs' output: FIFOs per proc, one selector thread per launcher.

Each launch gets a private directory with four FIFOs (see :mod:`rlmesh.actor.stdio`
for the worker's half). The reader ends are opened here *before* the proc starts, so
nothing the proc writes is lost, and they are read until the proc has exited and every
writer is gone: lines a SIGKILLed proc wrote before the kill still arrive. Lines become
:class:`~rlmesh.launch.output.ProcLine` values and stack dumps
:class:`~rlmesh.launch.output.StackDump` values, handed to the sinks of
:mod:`rlmesh.launch.output` (the ``logs`` / ``stacks`` tables, the terminal echo).

``RLMESH_CAPTURE=0`` turns capture off: procs inherit the controller's stdout/stderr.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import json
import re
import selectors
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rlmesh import settings
from rlmesh.actor.stdio import CAPTURE_DIR_ENV, CAPTURE_STDIO_ENV, FIFOS, NAMES_MARK, STACK_SIGNAL
from rlmesh.launch import output
from rlmesh.launch.echo import TerminalEcho, echo_enabled
from rlmesh.launch.output import ProcLine, ProcMeta, StackDump, OutputStream

logger = logging.getLogger(__name__)

CAPTURE_ENV = settings.CAPTURE.name
PIPE_BYTES = 1 << 20  # a larger pipe buffer: bursts of output do not stall the proc while we read
MAX_LINE = 1 << 20
DUMP_QUIET_S = 0.3  # a stack dump is complete once its writer was silent this long (or named its threads)
HUNG_DUMP_WAIT_S = 1.0  # how long a hung proc's kill waits for its stacks
GATHER_S = 0.01  # after a wake-up, wait this long before reading: batches lines (1 MB pipes never fill in 10 ms)

DIR_PREFIX = "rlmesh-capture-"
_DIR_NAME = re.compile(rf"{DIR_PREFIX}(\d+)-\w+")
_PIDLESS_NAME = re.compile(rf"{DIR_PREFIX}[a-z0-9_]{{8}}")  # mkdtemp's suffix alone: made before the pid was in the name
PIDLESS_IDLE_S = 3600.0
"""A folder without a pid in its name is reclaimed once no process holds a file in it open and it
has not changed for this long (a controller adds a FIFO to it at each launch)."""

_echo: TerminalEcho | None = None
_echo_lock = threading.Lock()


def reclaim_dead_capture_dirs(tmp: str | None = None) -> list[str]:
    """Remove the FIFO folders (``rlmesh-capture-<pid>-*`` in the temporary folder) of this user's
    controllers that are gone: a SIGKILLed controller runs no cleanup. Folders made before the pid
    was in the name (``rlmesh-capture-<8 characters>``) go once abandoned (:func:`_abandoned`).
    Returns the folders removed.
    Called by ``rlmesh clean`` and by each ``rlmesh run`` (a resume included)."""
    tmp = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(DIR_PREFIX):
            continue
        m = _DIR_NAME.fullmatch(name)
        path = os.path.join(tmp, name)
        try:
            if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
                continue
            if m is None:
                if _PIDLESS_NAME.fullmatch(name) and _abandoned(path):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
                continue
            os.kill(int(m.group(1)), 0)  # alive (or another user's pid: PermissionError): kept
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except (OSError, OverflowError):
            continue
    return removed


def _abandoned(path: str) -> bool:
    """True when the pid-less folder ``path`` is unchanged for :data:`PIDLESS_IDLE_S` and no process
    has a file in it open (a live controller holds the read end of each of its procs' FIFOs)."""
    if time.time() - os.stat(path).st_mtime < PIDLESS_IDLE_S:
        return False
    inside = path.rstrip(os.sep) + os.sep
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's: that user's processes cannot open this user's 0700 folder
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)).startswith(inside):
                    return False
            except OSError:
                continue
    return True


def capture_enabled() -> bool:
    return settings.CAPTURE.get()


def ensure_echo() -> TerminalEcho | None:
    """The process's one terminal echo (registered as a line sink), unless ``RLMESH_ECHO=0``."""
    global _echo
    with _echo_lock:
        if _echo is None and echo_enabled():
            _echo = TerminalEcho()
            output.add_line_sink(_echo)
        return _echo


def _open_writer(path: str) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)
    return fd


@dataclass
class _Proc:
    """One launched proc incarnation: its FIFO directory and what it has written."""

    dir: str
    proc_id: str
    proc_mesh: str
    rank: int
    incarnation: int
    host: str
    handle: Any = None
    open_streams: int = 0
    _meta: ProcMeta | None = None
    dump_req: "_DumpRequest | None" = None
    last_us: int = 0  # ts (microseconds) of its latest stdout/stderr line: the next one gets a later one

    def meta(self) -> ProcMeta:
        pid = getattr(self.handle, "pid", None)
        if self._meta is None or (self._meta.pid is None and pid is not None):
            self._meta = ProcMeta(self.proc_id, self.proc_mesh, self.rank, self.incarnation, self.host, pid)
        return self._meta

    def exited(self) -> bool:
        try:
            return self.handle is not None and self.handle.poll() is not None
        except Exception:  # noqa: BLE001
            return True


@dataclass
class _DumpRequest:
    reason: str
    then: Callable[[], None] | None
    deadline: float


@dataclass
class _Stream:
    proc: _Proc
    name: str  # out | err | log | stk
    fd: int
    buf: bytes = b""
    seen_data: bool = False
    dump_text: list[str] = field(default_factory=list)
    dump_last: float = 0.0


class Prepared:
    """FIFOs made for one launch: ``env`` for the worker, and (plain launches) fds for its stdout/stderr."""

    def __init__(self, capture: "OutputCapture", proc: _Proc, streams: list[_Stream], fork: bool):
        self.capture = capture
        self.proc = proc
        self.streams = streams
        self.env = {CAPTURE_DIR_ENV: proc.dir, CAPTURE_STDIO_ENV: "1" if fork else "0"}
        self.stdout_fd = self.stderr_fd = -1
        if not fork:
            self.stdout_fd = _open_writer(os.path.join(proc.dir, "out"))
            self.stderr_fd = _open_writer(os.path.join(proc.dir, "err"))

    def close_child_fds(self) -> None:
        """After the child has them (Popen duplicated them): the controller's copies go."""
        for fd in (self.stdout_fd, self.stderr_fd):
            if fd >= 0:
                os.close(fd)
        self.stdout_fd = self.stderr_fd = -1

    def started(self, handle: Any) -> None:
        self.close_child_fds()
        self.proc.handle = handle
        self.capture._submit(lambda: self.capture._watch(self))

    def abort(self) -> None:
        self.close_child_fds()
        for s in self.streams:
            os.close(s.fd)
        shutil.rmtree(self.proc.dir, ignore_errors=True)


class CapturedHandle:
    """A proc handle whose output is captured: adds :meth:`kill_hung` (stacks first, then SIGKILL)."""

    def __init__(self, inner: Any, prepared: Prepared):
        self.inner = inner
        self.prepared = prepared

    @property
    def pid(self) -> int | None:
        return self.inner.pid

    @property
    def local_pid(self) -> int | None:
        """The OS pid the supervisor may inspect (stopped vs running), when the inner handle has one."""
        return getattr(self.inner, "local_pid", None)

    def poll(self) -> Any:
        return self.inner.poll()

    def kill(self) -> None:
        self.inner.kill()

    def kill_hung(self, reason: str = "heartbeat timeout") -> None:
        """Dump the hung proc's stacks into the ``stacks`` table, then kill it (at most ~1 s later). Never blocks."""
        self.prepared.capture.request_stacks(self.prepared.proc, reason, then=self.inner.kill)


class OutputCapture:
    """One per launcher: makes each launch's FIFOs and reads them all on one thread."""

    def __init__(self) -> None:
        # mode 0700: only this user opens the FIFOs; the pid in the name: a killed controller's is reclaimed
        self.root = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")
        self.host = socket.gethostname()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()
        self._waiting: list[_Stream] = []  # EOF before any writer came (or after the last left): look again
        self._dumping: list[_Stream] = []
        self._procs: list[_Proc] = []
        self._closing = False
        ensure_echo()
        self._thread = threading.Thread(target=self._run, name="rlmesh-capture", daemon=True)
        self._thread.start()

    # ---- launcher side -------------------------------------------------------------
    def prepare(self, proc_id: str, proc_mesh: str, rank: int, incarnation: int, fork: bool) -> Prepared:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in proc_id)
        d = os.path.join(self.root, f"{safe}.{incarnation}")
        os.mkdir(d, 0o700)
        proc = _Proc(d, proc_id, proc_mesh, rank, incarnation, self.host)
        streams = []
        try:
            for name in FIFOS:
                path = os.path.join(d, name)
                os.mkfifo(path, 0o600)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                try:
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
                except OSError:
                    pass
                streams.append(_Stream(proc, name, fd))
            return Prepared(self, proc, streams, fork)
        except BaseException:
            for s in streams:
                os.close(s.fd)
            shutil.rmtree(d, ignore_errors=True)
            raise

    def request_stacks(self, proc: _Proc, reason: str, then: Callable[[], None] | None = None) -> None:
        """Signal the proc for a stack dump; record it with ``reason``; then call ``then`` (e.g. kill)."""
        def start() -> None:
            pid = proc.meta().pid
            proc.dump_req = _DumpRequest(reason, then, time.monotonic() + HUNG_DUMP_WAIT_S)
            try:
                if pid is None:
                    raise ProcessLookupError
                os.kill(pid, STACK_SIGNAL)
            except (ProcessLookupError, PermissionError):
                self._finish_request(proc)

        self._submit(start)

    def close(self, timeout: float = 2.0) -> None:
        """Read what is left (procs should be gone by now), print what the echo holds, remove the FIFOs."""
        self._closing = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout)
        if _echo is not None:
            _echo.flush()
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- reader thread ---------------------------------------------------------------
    def _submit(self, fn: Callable[[], None]) -> None:
        self._tasks.append(fn)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _watch(self, prep: Prepared) -> None:
        self._procs.append(prep.proc)
        prep.proc.open_streams = len(prep.streams)
        for s in prep.streams:
            self._sel.register(s.fd, selectors.EVENT_READ, s)

    def _run(self) -> None:
        last_sweep = 0.0
        while True:
            # Timed work (streams waiting for a writer, stack dumps going quiet, dump deadlines) needs a
            # look every 0.05 s; without any, sleep until a stream or the wake pipe is readable (an idle
            # run's controller woke this thread 20 times a second for nothing). 1 s is a safety net only.
            timed = self._waiting or self._dumping or any(p.dump_req is not None for p in self._procs)
            ready = self._sel.select(0.05 if timed else 1.0)
            if any(key.data is not None for key, _ in ready):
                time.sleep(GATHER_S)  # let a chatty proc's lines pile up: one read and one sink call per ~100 lines
            for key, _ in ready:
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                else:
                    self._read(key.data)
            while self._tasks:
                try:
                    self._tasks.popleft()()
                except Exception:  # noqa: BLE001
                    logger.exception("output capture task failed")
            now = time.monotonic()
            if now - last_sweep >= 0.05:
                last_sweep = now
                self._sweep(now)
            if self._closing and not any(p.open_streams for p in self._procs):
                return

    def _read(self, s: _Stream) -> None:
        try:
            data = os.read(s.fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            s.seen_data = True
            self._take(s, data)
            return
        self._sel.unregister(s.fd)  # EOF: no writer at the moment
        if self._closing or s.proc.exited():
            self._finish(s)
        else:
            self._waiting.append(s)

    def _sweep(self, now: float) -> None:
        waiting, self._waiting = self._waiting, []
        for s in waiting:
            if self._closing or s.proc.exited():
                self._drain_and_finish(s)
            else:
                self._sel.register(s.fd, selectors.EVENT_READ, s)
        for s in list(self._dumping):
            if s.dump_text and now - s.dump_last >= DUMP_QUIET_S:
                self._complete_dump(s)
        for p in self._procs:
            if p.dump_req is not None and now > p.dump_req.deadline:
                logger.warning("proc %s gave no stacks within %.1fs (stopped, or not capturing); killing it anyway",
                               p.proc_id, HUNG_DUMP_WAIT_S)
                self._finish_request(p)
        self._procs = [p for p in self._procs if p.open_streams or p.dump_req]

    def _drain_and_finish(self, s: _Stream) -> None:
        while True:
            try:
                data = os.read(s.fd, 1 << 16)
            except OSError:
                break
            if not data:
                break
            self._take(s, data)
        self._finish(s)

    def _take(self, s: _Stream, data: bytes) -> None:
        if s.name == "stk":
            s.dump_text.append(data.decode("utf-8", "replace"))
            s.dump_last = time.monotonic()
            if s not in self._dumping:
                self._dumping.append(s)
            if NAMES_MARK in s.dump_text[-1]:
                self._complete_dump(s)
            return
        buf = s.buf + data
        *lines, s.buf = buf.split(b"\n")
        if len(s.buf) > MAX_LINE:
            lines.append(s.buf)
            s.buf = b""
        self._lines(s, lines)

    def _lines(self, s: _Stream, raws: list[bytes]) -> None:
        meta = s.proc.meta()
        if s.name == "log":
            out = [output.log_record_line(r.decode("utf-8", "replace"), meta) for r in raws]
        else:
            # Lines are stamped when read, and one read holds every line written in the last ~10 ms
            # (GATHER_S): with one stamp, they would all share a ts and "the last line before the death"
            # could be any of them. Each line gets its own microsecond (the column's unit), in read
            # order, never at or before the proc's previous line; stamped mid-microsecond so the
            # float -> microseconds truncation keeps them apart.
            stream = OutputStream.STDOUT if s.name == "out" else OutputStream.STDERR
            us = max(int(time.time() * 1e6), s.proc.last_us + 1)
            out = []
            for r in raws:
                out.append(ProcLine((us + 0.5) / 1e6, meta, stream, r.decode("utf-8", "replace").rstrip("\r")))
                us += 1
            s.proc.last_us = us - 1
        output.emit_lines(out)

    def _complete_dump(self, s: _Stream) -> None:
        text = "".join(s.dump_text)
        s.dump_text = []
        if s in self._dumping:
            self._dumping.remove(s)
        names: dict[str, str] = {}
        body = []
        for line in text.splitlines():
            if line.startswith(NAMES_MARK):
                try:
                    names.update(json.loads(line[len(NAMES_MARK):]))
                except ValueError:
                    pass
            else:
                body.append(line)
        frames = output.parse_faulthandler("\n".join(body), names)
        req = s.proc.dump_req
        reason = req.reason if req is not None else "signal"
        if frames:
            output.emit_stacks(StackDump(time.time(), s.proc.meta(), reason, tuple(frames)))
        if req is not None:
            self._finish_request(s.proc)

    def _finish_request(self, proc: _Proc) -> None:
        req, proc.dump_req = proc.dump_req, None
        if req is not None and req.then is not None:
            try:
                req.then()
            except Exception:  # noqa: BLE001
                logger.exception("after the stack dump of %s", proc.proc_id)

    def _finish(self, s: _Stream) -> None:
        if s.buf:
            self._lines(s, [s.buf])
            s.buf = b""
        if s.dump_text:
            self._complete_dump(s)
        try:
            os.close(s.fd)
        except OSError:
            pass
        s.proc.open_streams -= 1
        if s.proc.open_streams <= 0:
            shutil.rmtree(s.proc.dir, ignore_errors=True)


def captured(handle: Any, prepared: Prepared | None) -> Any:
    """``handle`` itself without capture, else wrapped so the supervisor can take its stacks before a kill."""
    if prepared is None:
        return handle
    prepared.started(handle)
    return CapturedHandle(handle, prepared)
