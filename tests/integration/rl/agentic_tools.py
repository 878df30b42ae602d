"""Tools and environments for tests/integration/rl/test_agentic.py (stdlib only at import: the
isolated tool sandbox imports this module in a fresh interpreter)."""

from __future__ import annotations

import os
import signal
import socket
import time

from rlmesh.rl.agentic.calculator import CalculatorEnv
from rlmesh.rl.agentic.protocol import StepResult
from rlmesh.rl.agentic.tools import Tool, ToolLimits


def hang(args: str) -> str:
    time.sleep(3600)
    return "never"


def crash(args: str) -> str:
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


def hog(args: str) -> str:
    block = bytearray(2 * 2**30)  # 2 GiB against a 128 MB limit
    return str(len(block))


def connect(args: str) -> str:
    with socket.create_connection(("127.0.0.1", int(args)), timeout=20):  # gross bound: a busy host is slow
        return "connected"


def where(args: str) -> str:
    with open("note.txt", "w") as f:
        f.write("scratch")
    return os.getcwd()


def boom(args: str) -> str:
    raise ValueError("bad input " + args)


class GatedCalculatorEnv(CalculatorEnv):
    """The calculator env whose every step waits while the file ``gate`` exists (up to 60 s), after
    touching ``<gate>.<pid>.<n>``: a test sees episodes mid-step, kills the proc, then opens the gate."""

    def __init__(self, gate: str) -> None:
        super().__init__()
        self.gate = gate

    def step(self, model_text: str) -> StepResult:
        if os.path.exists(self.gate):
            with open(f"{self.gate}.{os.getpid()}.{id(self)}", "w"):
                pass
            deadline = time.monotonic() + 60
            while os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().step(model_text)


class HangingToolEnv(CalculatorEnv):
    """The calculator env whose tool hangs: every call ends in a timeout error observation."""

    def __init__(self) -> None:
        super().__init__()
        self.tools = {"calculator": Tool("calculator", hang, isolate=True, limits=ToolLimits(timeout_s=0.5))}


class ScriptedEnv(CalculatorEnv):
    """Per-turn rewards: 0.25 for a tool call, plus the final verdict (the episode return sums them)."""

    def step(self, model_text: str) -> StepResult:
        r = super().step(model_text)
        if r.tool is not None:
            r.reward = 0.25
        return r
