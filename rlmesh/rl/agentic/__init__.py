"""Multi-turn, tool-using episodes for LLM agents (issue 17).

The pieces, bottom up:

- :mod:`.protocol` — the text-environment contract: ``reset(task) -> observation``,
  ``step(model_text) -> StepResult``; subclass :class:`~.protocol.TextEnv`.
- :mod:`.tools` / :mod:`.sandbox` — tools run under a wall-clock timeout, and (``isolate=True``)
  in a subprocess with a memory limit, no network and a scratch directory. A tool that hangs,
  crashes or runs out of memory gives an error *observation*, never a stalled episode.
- :mod:`.env_actor` — :class:`~.env_actor.EnvActor` hosts many episodes' environments in its own
  mesh (``env``); clients reach it by episode, in process or across procs.
- :mod:`.episodes` — the turn-by-turn loop: generate until a tool-call stop token or the end,
  step the environment, append the observation (masked out of the loss), continue; many episodes
  in flight, so the model generates for some while tools run for others.
- :mod:`.generator` — :class:`~.generator.AgenticGenerator`, the ``LLMGenerator`` whose work
  items are groups of episodes; its trajectories train with the unchanged GRPO/RLOO trainers.
- :mod:`.sft` / :mod:`.training` — the warm start on demonstration episodes, and the in-process
  loop (collect, GRPO step, held-out accuracy) the learning test and the benchmark run.
- :mod:`.calculator` — the worked example: multiplication with a calculator tool
  (``rlmesh run recipe=grpo_calculator``, ``recipes/agentic.py``).

Submodules are imported explicitly; this package imports nothing on its own.
"""
