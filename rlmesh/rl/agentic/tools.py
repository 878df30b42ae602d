"""Running one tool call under limits, so a bad tool costs an error observation, not an episode.

Two ways to run, chosen per tool:

- ``isolate=True`` — a fresh ``python -m rlmesh.rl.agentic.sandbox`` subprocess in its own
  session and scratch directory (deleted afterwards), with ``RLIMIT_AS`` at ``memory_mb``, no
  network (a new network namespace where the kernel allows it, else the ``socket`` module
  refuses to connect), killed at ``timeout_s``. For code execution and anything untrusted.
  The tool function must be importable by name (``module:qualname``).
- ``isolate=False`` — a thread in the environment's proc: only the timeout is enforced (a hung
  call is abandoned, its thread left to finish). For cheap trusted tools (a calculator) whose
  per-call subprocess (tens of ms) would dominate.

Either way a timeout, a crash (a signal, an exit), a ``MemoryError`` or an exception becomes a
:class:`ToolResult` whose ``error`` says which (:class:`ToolError`) and why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable


class ToolError(StrEnum):
    """Why a tool call gave no output."""

    TIMEOUT = "timeout"
    CRASHED = "crashed"
    MEMORY = "memory"
    EXCEPTION = "exception"
    UNKNOWN = "unknown_tool"


@dataclass(frozen=True)
class ToolLimits:
    """Limits of one tool call."""

    timeout_s: float = 5.0
    """Wall-clock limit; the call is killed (isolated) or abandoned (in-process) after it."""
    memory_mb: int = 512
    """Address space an isolated call may map beyond the interpreter and its tool's module once
    imported (``RLIMIT_AS`` set to what is mapped then plus this)."""
    network: bool = False
    """Allow network access in an isolated call."""
    max_output_chars: int = 2000
    """Longer output is truncated (it becomes context tokens)."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"ToolLimits.timeout_s={self.timeout_s} must be > 0")
        if self.memory_mb < 32:
            raise ValueError(f"ToolLimits.memory_mb={self.memory_mb} is below what Python needs; use >= 32")


@dataclass(frozen=True)
class Tool:
    """A named function ``str -> str`` and how to run it."""

    name: str
    fn: Callable[[str], str]
    isolate: bool = True
    limits: ToolLimits | None = None
    """``None``: the environment's ``limits``."""


@dataclass
class ToolResult:
    """A call's output, or its error (``"<ToolError>: detail"``), and how long it took."""

    output: str
    error: str | None
    latency_s: float


def run_tool(tool: Tool, args: str, limits: ToolLimits) -> ToolResult:
    """Run ``tool.fn(args)`` under ``limits`` (see the module docstring)."""
    t0 = time.perf_counter()
    output, error = (_isolated if tool.isolate else _threaded)(tool, args, limits)
    if output and len(output) > limits.max_output_chars:
        output = output[:limits.max_output_chars]
    return ToolResult(output or "", error, time.perf_counter() - t0)


def _threaded(tool: Tool, args: str, limits: ToolLimits) -> tuple[str, str | None]:
    box: dict[str, tuple[str, str | None]] = {}

    def target() -> None:
        try:
            box["r"] = (str(tool.fn(args)), None)
        except MemoryError:
            box["r"] = ("", f"{ToolError.MEMORY}: out of memory")
        except Exception as exc:  # noqa: BLE001 - a tool's failure is an observation
            box["r"] = ("", f"{ToolError.EXCEPTION}: {type(exc).__name__}: {exc}"[:300])

    th = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    th.start()
    th.join(limits.timeout_s)
    if "r" not in box:
        return "", f"{ToolError.TIMEOUT}: {tool.name} ran past {limits.timeout_s:g} s"
    return box["r"]


def _isolated(tool: Tool, args: str, limits: ToolLimits) -> tuple[str, str | None]:
    target = f"{tool.fn.__module__}:{tool.fn.__qualname__}"
    payload = json.dumps({"target": target, "args": args, "memory_mb": limits.memory_mb, "network": limits.network})
    scratch = tempfile.mkdtemp(prefix=f"rlmesh-tool-{tool.name}-")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": scratch, "TMPDIR": scratch,
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rlmesh.rl.agentic.sandbox"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=scratch, env=env,
                            start_new_session=True)
    try:
        try:
            out, err = proc.communicate(payload.encode(), timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return "", f"{ToolError.TIMEOUT}: {tool.name} ran past {limits.timeout_s:g} s (killed)"
    finally:
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode != 0:
        how = (f"signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exit code {proc.returncode}")
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if "MemoryError" in tail[0]:
            return "", f"{ToolError.MEMORY}: {tool.name} went past {limits.memory_mb} MB"
        return "", f"{ToolError.CRASHED}: {tool.name} died ({how}) {tail[0][:200]}".rstrip()
    try:
        reply = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "", f"{ToolError.CRASHED}: {tool.name} wrote no result"
    return reply.get("output", ""), reply.get("error")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the tool's own children too (its own session)
    except ProcessLookupError:
        pass
