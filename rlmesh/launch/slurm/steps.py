"""One worker proc = one job step: ``srun`` runs it, and the ``srun`` process is its handle.

The controller polls every handle every 50 ms on its supervisor thread, so :class:`StepHandle`
answers from what two reader threads learned from ``srun``'s output: the worker's own lines
(handed to the ``logs`` table and the terminal echo, as a local proc's are) and Slurm's lines
about the step (``srun: error: Node failure``, ``*** STEP ... CANCELLED ... DUE TO PREEMPTION
***``), which become the reason of the proc's death. Killing a step is ``scancel --signal=KILL``
of that step on the launcher's pool, never on the supervisor thread.
"""

from __future__ import annotations

import collections
import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import IO, Any, Callable, Protocol

from rlmesh.launch import output
from rlmesh.launch.capture import capture_enabled, ensure_echo
from rlmesh.launch.output import OutputStream, ProcLine, ProcMeta
from rlmesh.launch.slurm.commands import PREEMPT_MARK, step_outcome

logger = logging.getLogger(__name__)

READ_GRACE_S = 2.0
"""After ``srun`` exits, how long ``poll()`` waits for its last lines (the reason) before answering."""
KILL_WAIT_S = 3.0
"""After ``scancel`` of a step, how long ``srun`` gets to end before it is SIGKILLed here (a step
on a lost node never reports back; its ``srun`` would wait for ``SlurmdTimeout``)."""


class StepOwner(Protocol):
    """What a :class:`StepHandle` needs from its launcher (``SlurmLauncher`` satisfies it)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the launcher's pool."""

    def cancel_step(self, handle: "StepHandle") -> None:
        """``scancel --signal=KILL`` the step of ``handle`` (best effort)."""

    def on_sigterm(self, handle: "StepHandle") -> None:
        """Slurm sent the step's worker SIGTERM: decide whether the job is ending."""

    def step_finished(self, handle: "StepHandle") -> None:
        """The step's ``srun`` ended."""


class StepHandle:
    """One proc incarnation's job step, as the controller's supervisor sees it (``ProcHandle``)."""

    def __init__(self, owner: StepOwner, meta: ProcMeta, step_name: str):
        self.pid: int | None = None  # the worker's pid comes from its HELLO; srun's is not the proc's
        self.meta = meta
        self.node = ""
        self.step_name = step_name
        self.killed = False
        self.popen: subprocess.Popen | None = None
        self._owner = owner
        self._slurm_lines: collections.deque[str] = collections.deque(maxlen=20)
        self._status: tuple[int | None, int | None, str] | None = None
        self._exited_at: float | None = None
        self._sigterm_seen = False
        self._capture = capture_enabled()
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, argv: list[str], env: dict[str, str], node: str) -> None:
        """Run ``srun`` for the step on ``node`` (on the launcher's pool: the supervisor never waits on it)."""
        with self._lock:
            if self.killed:
                self.fail("killed before its step started", signal.SIGKILL)
                return
            self.node = node
            self.meta = replace(self.meta, host=node)
            if self._capture:
                ensure_echo()
            self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True)
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self._readers = [threading.Thread(target=self._read, args=(s, kind), daemon=True,
                                          name=f"rlmesh-slurm-{kind}[{self.meta.proc_id}]")
                         for s, kind in ((self.popen.stdout, OutputStream.STDOUT),
                                         (self.popen.stderr, OutputStream.STDERR))]
        for t in self._readers:
            t.start()

    def lose(self, reason: str) -> None:
        """Its node is lost (slurmd does not answer): the proc is dead now, with ``reason``. The local
        ``srun`` is SIGKILLed (it would wait for Slurm to notice the node, ``SlurmdTimeout``)."""
        if self._status is not None:
            return
        self.killed = True
        self._status = (None, None, reason)
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
        self._owner.step_finished(self)

    def fail(self, reason: str, sig: int | None = None) -> None:
        """The step could not start (no usable node, srun missing): the proc is dead with ``reason``."""
        if self._status is None:
            self._status = (None, sig, reason)
            self._owner.step_finished(self)

    # ---------------------------------------------------------------- ProcHandle
    def poll(self) -> tuple[int | None, int | None, str] | None:
        """``None`` while the step runs, else ``(exit_code, signal, reason)``; never blocks."""
        if self._status is not None:
            return self._status
        if self.popen is None:
            return None  # the pool has not started it yet
        rc = self.popen.poll()
        if rc is None:
            return None
        now = time.monotonic()
        if self._exited_at is None:
            self._exited_at = now
        if any(t.is_alive() for t in self._readers) and now - self._exited_at < READ_GRACE_S:
            return None  # its last lines (Slurm's reason) are still on their way
        code, sig, why = step_outcome(rc, list(self._slurm_lines))
        if self.killed and sig is None and code != 0:
            sig = signal.SIGKILL
            code = None
        self._status = (code, sig, f"{why} (step {self.step_name} on {self.node})" if why else "")
        self._owner.step_finished(self)
        return self._status

    def kill(self) -> None:
        """Cancel the step (``scancel --signal=KILL``) on the pool; returns at once."""
        if self.killed:
            return
        self.killed = True
        self._owner.submit(self._kill)

    def _kill(self) -> None:
        with self._lock:
            if self.popen is None:
                return  # start() sees `killed` and ends it
        if self.popen.poll() is None:
            self._owner.cancel_step(self)
        try:
            self.popen.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # a lost node never reports the step's end
            self.popen.kill()
            self.popen.wait()

    # ---------------------------------------------------------------- output
    def _read(self, stream: IO[bytes], kind: OutputStream) -> None:
        try:
            for raw in stream:
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith(("srun:", "slurmstepd:")) or "*** STEP" in text or "*** JOB" in text:
                    self._slurm_lines.append(text)
                if PREEMPT_MARK in text and not self._sigterm_seen:
                    self._sigterm_seen = True
                    self._owner.on_sigterm(self)
                if self._capture:
                    output.emit_line(ProcLine(time.time(), self.meta, kind, text))
                else:  # as a local proc with RLMESH_CAPTURE=0 writes to the controller's terminal
                    print(text, file=sys.stdout if kind == OutputStream.STDOUT else sys.stderr, flush=True)
        except (OSError, ValueError):  # closed under us at shutdown
            pass
        finally:
            stream.close()

    def __repr__(self) -> str:
        return f"<StepHandle {self.step_name} on {self.node} status={self._status}>"
