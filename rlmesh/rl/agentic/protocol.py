"""The text-environment protocol every agentic environment keeps.

An episode is ``reset(task)`` (the first observation: the prompt), then ``step(model_text)``
once per model turn until ``done``. The model's text of a turn ends either with a tool call
(the environment runs the tool and answers with its output) or with a final answer (the
environment scores it and ends the episode). Rewards may come per turn or only at the end:
an episode's return is the sum of its steps' rewards.

Why a class and not a function: environments hold per-episode state (the task, the tools'
scratch directory, a conversation), and the :class:`~rlmesh.rl.agentic.env_actor.EnvActor`
keeps one instance per episode in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlmesh.rl.agentic.tools import Tool, ToolLimits, ToolResult, run_tool


@dataclass
class ToolCall:
    """What a step's tool call was and how it went (one row of the ``turns`` table)."""

    tool: str
    args: str
    latency_s: float
    error: str | None = None
    """``None`` when the tool answered; else its :class:`~rlmesh.rl.agentic.tools.ToolError` and detail."""


@dataclass
class StepResult:
    """The environment's answer to one model turn."""

    observation: str
    """Text appended to the context (a tool's output); empty when the episode ends."""
    reward: float = 0.0
    """This turn's reward (per-turn shaping), or the episode's verdict on its final step."""
    done: bool = False
    """The episode ended (a final answer, or the environment gave up)."""
    tool: ToolCall | None = None
    """The tool this turn called, if any."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form extras for the user's own analysis (never read by rlmesh)."""


class TextEnv:
    """Base class of text environments; override :meth:`reset` and :meth:`step`.

    ``tools`` maps tool names to :class:`~rlmesh.rl.agentic.tools.Tool`; :meth:`call_tool`
    runs one under its limits and turns every failure into a :class:`ToolCall` with an error,
    so a subclass's ``step`` never has to catch anything.
    """

    tools: dict[str, Tool] = {}
    limits: ToolLimits = ToolLimits()

    def reset(self, task: Any) -> str:
        """Start an episode on ``task`` (any picklable object); return the first observation."""
        raise NotImplementedError

    def step(self, model_text: str) -> StepResult:
        """React to the model's text of one turn (including its stop token, if any)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release per-episode resources; called once when the episode ends or is dropped."""

    def call_tool(self, name: str, args: str) -> tuple[ToolResult, ToolCall]:
        """Run tool ``name`` on ``args`` under its limits; an unknown name is an error result too."""
        tool = self.tools.get(name)
        if tool is None:
            result = ToolResult("", f"unknown tool {name!r}; tools: {sorted(self.tools) or 'none'}", 0.0)
        else:
            result = run_tool(tool, args, tool.limits or self.limits)
        return result, ToolCall(name, args, result.latency_s, result.error)
