"""The schema of agentic recipes (``schema/agentic``, ``program=agentic``): GRPO (or RLOO, DAPO)
on multi-turn, tool-using episodes, with the environments in their own mesh."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

from rlmesh.actor.faults import FaultConfig
from rlmesh.recipes.recipe_config import EvalConfig, PolicyModelConfig, RunConfig, check_faults, check_llm_recipe
from rlmesh.recipes.workspace_option import WorkspaceConfig
from rlmesh.rl.agentic.config import AgenticGeneratorConfig, EnvConfig
from rlmesh.rl.config import BufferConfig, GRPOConfig, check
from rlmesh.telemetry.config import TelemetryConfig


@dataclass
class CalculatorTaskConfig:
    """The calculator task (:class:`rlmesh.rl.agentic.calculator.MultiplicationTask`)."""

    min_digits: int = 2
    """Smallest operand size."""
    max_digits: int = 2
    """Largest operand size."""
    heldout_fraction: float = 0.1
    """Share of problems reserved for evaluation (never trained on)."""
    sft_tool_fraction: float = 0.35
    """Share of warm-start demonstrations that use the tool (0 with ``env.kwargs.tools=false``)."""

    def __post_init__(self) -> None:
        check(1 <= self.min_digits <= self.max_digits <= 6, "task.min_digits", self.min_digits,
              f"use 1 <= task.min_digits <= task.max_digits ({self.max_digits}) <= 6")
        check(0 <= self.sft_tool_fraction <= 1, "task.sft_tool_fraction", self.sft_tool_fraction, "use a value in [0, 1]")


@dataclass
class AgenticRecipeConfig:
    """A complete agentic experiment: task, model, agentic generator, env mesh, trainer, buffer, evaluation."""

    program: str = "agentic"
    """Controller program under ``recipes/`` that runs this config."""
    task: CalculatorTaskConfig = field(default_factory=CalculatorTaskConfig)
    model: PolicyModelConfig = field(default_factory=PolicyModelConfig)
    generator: AgenticGeneratorConfig = field(default_factory=AgenticGeneratorConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    trainer: GRPOConfig = field(default_factory=GRPOConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=10, episodes=300))
    run: RunConfig = field(default_factory=RunConfig)
    steps: int = 30
    """GRPO train steps."""
    prompts_per_step: int = 16
    """Tasks per train step (each played ``generator.samples_per_prompt`` times), split over the generators."""
    launcher: Dict[str, Any] = field(default_factory=dict)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    """Built-in fault injection (``faults.kill=env`` kills an env proc); off by default."""
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """The controller's project folder to every proc (``workspace.sync=true``; on for Kubernetes by default):
    a tool environment edited here reaches the env procs without an image rebuild."""

    def proc_meshes(self) -> dict[str, int]:
        """Proc meshes by name: buffer+evaluator, trainer, env actors, generators."""
        return {"rl": 2 + self.env.replicas + self.generator.replicas}

    def __post_init__(self) -> None:
        check(self.program == "agentic", "program", self.program, "an agentic config runs with program=agentic")
        check_faults(self.faults, self.run, ("generator", "trainer", "env", "buffer"))
        check_llm_recipe(self, "episodes per task")
        check(self.trainer.ranks == 1, "trainer.ranks", self.trainer.ranks,
              "the agentic recipe places its trainer on one proc; use trainer.ranks=1 (ranks > 1: recipe=grpo_*)")
