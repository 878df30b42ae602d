"""The one controller loop every recipe runs: procs, work, training, evaluation, recovery, summary.

A recipe program (``recipes/ppo.py``, ``recipes/grpo.py``) only says what differs: which actors
to spawn where (a function returning :class:`Roles`) and a :class:`Plan` (the budget and its
unit, the generator endpoint that does one work item, how to evaluate). Everything else is here,
once:

1. **Start** (:func:`run_recipe`): the run's identity (a new run, or ``run.resume``), the work
   ledger, procs with the restart policy, the workspace sync (``workspace.sync``), the roles,
   fault injection.
2. **Loop** (:func:`drive`): each generator replica serves work items from the scheduler, whose
   credit bounds generation ahead of training by ``buffer.max_policy_lag`` versions; the trainer
   trains on what the buffer holds (:meth:`Recovery.train` settles the work ledger and survives
   a dead trainer or buffer); every ``eval.every`` units an evaluation of the newest version is
   started beside training, and once more at the end, **at most once per version**.
3. **End**: a failed run leaves a final checkpoint and says how to resume; a finished one prints a
   summary read back from telemetry, so the table agrees with the ``evals`` table by construction.

The loop never looks inside rollouts or batches, so it serves on-policy algorithms (PPO, A2C,
GRPO: the trainer samples fresh rollouts within the lag bound) and off-policy ones alike (DQN,
SAC: the trainer keeps a replay memory of everything it was handed and performs its own number
of updates per call, docs/extending.md).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable

import rlmesh as rm
from rlmesh.actor.faults import FaultInjector
from rlmesh.recipes.run_state import begin
from rlmesh.recipes.startup import say
from rlmesh.recipes.workspace_option import sync_recipe_procs
from rlmesh.rl.run.placement import call_trainer, place
from rlmesh.rl.run.report import RunProgress, print_summary, proc_memory_line, telemetry_counts
from rlmesh.rl.run.warmup import WarmupDisplay
from rlmesh.rl.run.resilience import (Recovery, RunFailed, WorkLedger, abandon_previous, final_checkpoint,
                                  run_with_replicas, serve_work)
from rlmesh.rl.results import EvalResult, TrainResult
from rlmesh.rl.run.schedule import AsyncWorkScheduler, WorkItem


class Unit(StrEnum):
    """What a recipe's budget and ``eval.every`` count."""

    ENV_STEPS = "env steps"
    """Transitions trained on (``TrainResult.samples_seen``): the gym recipes."""
    TRAIN_STEPS = "steps"
    """Train steps (``TrainResult.step``): the LLM recipes."""


@dataclass
class Roles:
    """The spawned actor meshes. ``generators`` has one proc per replica (sliced with ``procs=i``)."""

    generators: Any
    """``None`` when the trainer collects its own rollouts (``generator.in_trainer``)."""
    trainer: Any
    buffer: Any
    evaluator: Any
    others: dict[str, Any] = field(default_factory=dict)
    """More meshes by role name (``reward``), for fault injection."""

    def by_role(self) -> dict[str, Any]:
        """The meshes by the role names ``faults.kill=...`` uses (each role this run has)."""
        meshes = {"generator": self.generators, "trainer": self.trainer, "buffer": self.buffer, **self.others}
        return {role: mesh for role, mesh in meshes.items() if mesh is not None}

    def stop_order(self) -> list[list[str]]:
        """Proc ids in the order a run stops them (``ProcMesh.stop(order=...)``): callers before callees.

        First the work producers (generators, evaluator: they call everything else), then the trainer
        and buffer (generators submit to the buffer and pull the trainer's weights), then the other
        roles (reward, env: only called). A proc hosting actors of several stages stops with the
        last of them, so nothing it serves goes before its callers. Why: stopped all at once, a
        generator finishing its last item met reward procs that had already exited, and logged a
        "retrying on a live reward replica" warning every 50 ms until its own stop ended it."""
        stages = [[self.generators, self.evaluator], [self.trainer, self.buffer], list(self.others.values())]
        stage_of: dict[str, int] = {}
        for i, meshes in enumerate(stages):
            for mesh in meshes:
                for proc_id in getattr(mesh, "proc_ids", ()):
                    stage_of[proc_id] = i
        return [[p for p, s in stage_of.items() if s == i] for i in range(len(stages))]


@dataclass
class Plan:
    """What a recipe's loop does that another's does not."""

    budget: int
    """Train until this many units (``unit``) are reached."""
    unit: Unit
    work_endpoint: str
    """The generator endpoint that does one work item (``collect``, ``generate``)."""
    work_args: Callable[[WorkItem, int], tuple]
    """``(item, generation) -> args`` of that endpoint (the same args on a re-issue of the item)."""
    eval_args: Callable[[int, int], tuple]
    """``(min_version, samples_seen) -> args`` of the evaluator's ``evaluate``."""
    id_prefix: str = "rollout"
    """Work ids are ``<prefix>-<n>`` (``<prefix>-g<generation>-<n>`` after a resume)."""
    collect_in_trainer: bool = False
    """The trainer collects its own rollouts (``generator.in_trainer``): no generator loops; each train
    call is ``collect_and_train`` up to the next evaluation (or the budget)."""
    eval_at_start: bool = False
    """Also evaluate the starting weights (the LLM recipes: the level the warm start reached)."""
    reward_metric: str = "charts/episodic_return"
    """The train metric the progress bar shows as reward."""
    on_work: Callable[[dict[str, Any]], None] | None = None
    """Called with each finished work item's summary (tokens/s, ...)."""
    on_train: Callable[[TrainResult], None] | None = None
    """Called with each train step's result."""
    extras: Callable[[], dict[str, Any]] = dict
    """Recipe-specific numbers for ``RunResult.extras``, asked for once the loop ended."""
    summary: Callable[["RunResult"], list[tuple[str, str]]] = lambda result: []
    """Rows the recipe adds at the top of the closing summary."""
    finish: Callable[[Roles, "RunResult"], None] | None = None
    """Called once the loop ended well, before the procs stop (export the trained model)."""

    def progress(self, m: Any) -> int:
        """Where ``m`` (a ``TrainResult`` or ``TrainerState``) stands, in ``unit``."""
        return m.samples_seen if self.unit is Unit.ENV_STEPS else m.step


@dataclass
class RunResult:
    """What a recipe run returns (and writes to ``runs/<run>/result.json``)."""

    run_id: str | None
    generation: int = 0
    """0 for the first controller of the run, +1 per resume."""
    abandoned: int = 0
    """Work ids a dead controller left open, closed as ``abandoned`` by this resume."""
    faults_injected: int = 0
    wall_s: float = 0.0
    """The controller loop's wall time."""
    step: int = 0
    policy_version: int = 0
    samples_seen: int = 0
    """Samples trained on at the end (env steps for gym recipes)."""
    evals: list[tuple[int, EvalResult]] = field(default_factory=list)
    """``(samples_seen when requested, result)`` of every evaluation this controller made, in order of version."""
    solved_samples: int | None = None
    """``samples_seen`` at the first evaluation that reached ``eval.target`` (``None``: never)."""
    solved_s: float | None = None
    """Seconds from the loop's start to that evaluation's answer."""
    issued: int = 0
    reissued: int = 0
    counts: dict[str, Any] = field(default_factory=dict)
    """The telemetry summary (:func:`rlmesh.rl.run.report.telemetry_counts`; empty with telemetry off)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Recipe-specific numbers (``gen_tokens_per_s``, ``train_samples_per_s``)."""

    @property
    def final_eval(self) -> EvalResult | None:
        """The evaluation of the newest version evaluated."""
        return max((e for _, e in self.evals), key=lambda e: e.policy_version, default=None)

    @property
    def objective(self) -> float | None:
        """The number a sweep optimises: the final evaluation's value."""
        return self.final_eval.value if self.final_eval else None

    @property
    def train_steps(self) -> int:
        return int(self.counts.get("train_steps", self.step))

    @property
    def rollouts(self) -> int:
        return int(self.counts.get("rollouts", 0))

    @property
    def distinct_ids(self) -> int:
        return int(self.counts.get("distinct_ids", 0))

    def to_dict(self) -> dict[str, Any]:
        """``result.json``: the fields, the counts and extras flattened in, evaluations as
        ``[samples, value]`` pairs; ``env_steps`` is ``samples_seen`` (the name benchmarks read)."""
        out = {k: v for k, v in vars(self).items() if k not in ("evals", "counts", "extras")}
        out.update(self.counts, **self.extras, env_steps=self.samples_seen, objective=self.objective,
                   evals=[[n, e.value] for n, e in self.evals], solved_steps=self.solved_samples)
        return out


def seeded_prompts(task: Any, per_item: int, seed: int) -> Callable[[WorkItem, int], tuple[WorkItem, list[Any]]]:
    """An LLM recipe's ``Plan.work_args``: ``per_item`` training prompts for a work item, drawn from
    a generator seeded by the run's seed, the ledger's generation and the item's index, so a
    re-issued item (same index) gets the same prompts again and a resumed run new ones."""
    def prompts(item: WorkItem, generation: int) -> tuple[WorkItem, list[Any]]:
        if hasattr(task, "batch"):  # a data set: the item's place in the epochs (a resumed run reshuffles)
            return item, task.batch(item.index, per_item, seed * 1_000_003 + generation * 7_919)
        rng = random.Random(seed * 1_000_003 + generation * 7_919 + item.index)
        return item, task.sample(per_item, rng, "train")

    return prompts


def run_recipe(cfg: Any, launcher: str, spawn: Callable[[Any], Roles], plan: Plan) -> RunResult:
    """Run recipe config ``cfg``: start (or resume) its run, spawn ``cfg.proc_meshes()['rl']`` procs and
    the roles ``spawn(procs)`` places on them, :func:`drive` the loop, stop the procs, print the summary."""
    cfg.telemetry.apply()
    run = begin(cfg, launcher)  # a new run, or (run.resume) the same run id, database and checkpoints
    ledger = WorkLedger(run.generation)
    result = RunResult(run.run_id, run.generation)
    result.abandoned = abandon_previous(rm.telemetry.query, ledger) if run.generation else 0
    n = cfg.proc_meshes()["rl"]
    say(f"{'run ' + run.run_id + ': ' if run.run_id else ''}starting {n} procs ({launcher})", cfg.run.progress)
    procs = place(launcher, cfg.launcher).spawn_procs(per_host={"procs": n}, name="rl",
                                                     restart=cfg.run.restart_policy())  # N restarts in T s, run.*_s
    roles: Roles | None = None
    try:
        sync_recipe_procs(cfg, launcher, procs, run.run_id)  # workspace.sync: the project folder, before any actor
        say(f"creating the actors on the {n} procs (their classes import torch, each proc joins first)",
            cfg.run.progress)
        with WarmupDisplay(rm.telemetry.query, cfg.run.progress and run.run_id is not None):  # SFT, engine start
            roles = spawn(procs)
        say("actors ready; training", cfg.run.progress)
        with FaultInjector.from_config(cfg.faults, roles.by_role()) as faults:
            try:
                asyncio.run(drive(cfg, roles, plan, ledger, result))
            except RunFailed as exc:
                final_checkpoint(roles.trainer, roles.buffer, exc)
                raise
        result.faults_injected = len(faults.injected)
        if plan.finish is not None:
            plan.finish(roles, result)
    finally:
        procs.stop(order=roles.stop_order() if roles else ())  # callers first: nobody calls a stopped proc
    result.extras = plan.extras()
    if run.run_id is not None:  # telemetry=off: nothing recorded, nothing to summarise
        rm.telemetry.flush()
        result.counts = telemetry_counts(rm.telemetry.query, cfg.eval.target)
        print_summary(run.run_id, plan.summary(result) + summary_rows(result, plan.unit, cfg.eval.target))
    return result


def _quiet_on_interrupt(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Ctrl-C or SIGTERM (a ``KeyboardInterrupt`` raised by the signal handler inside one of the
    loop's tasks) ends the run cleanly upstream; asyncio would also print that task's traceback as
    "exception was never retrieved". Everything else goes to asyncio's default handler."""
    if isinstance(context.get("exception"), (KeyboardInterrupt, SystemExit)):
        return
    loop.default_exception_handler(context)


async def drive(cfg: Any, roles: Roles, plan: Plan, ledger: WorkLedger, result: RunResult) -> None:
    """The loop itself (see the module docstring); fills ``result``'s counters and evaluations."""
    asyncio.get_running_loop().set_exception_handler(_quiet_on_interrupt)
    replicas = 0 if plan.collect_in_trainer else cfg.generator.replicas
    prefix = f"{plan.id_prefix}-" if ledger.generation == 0 else f"{plan.id_prefix}-g{ledger.generation}-"
    work = AsyncWorkScheduler(per_step=max(replicas, 1), max_policy_lag=cfg.buffer.max_policy_lag, prefix=prefix,
                              on_event=ledger)
    # other roles' meshes (reward, env) by name: a generator failing because one of them died waits for it
    recovery = Recovery(cfg.run.recovery_timeout_s,
                        meshes={**roles.others, "buffer": roles.buffer, "trainer": roles.trainer})
    stop = asyncio.Event()
    start = time.perf_counter()
    # a resumed run's trainer starts from its checkpoint; a trainer killed right now is replaced, not fatal
    state = await recovery.call_surviving(roles.trainer, "trainer", lambda: call_trainer(roles.trainer, "state"))
    result.step, result.policy_version, result.samples_seen = state.step, state.policy_version, state.samples_seen
    requested: set[int] = set()  # versions an evaluation was asked for: one evaluation per version
    pending: list[asyncio.Future] = []

    def replica(i: int):
        one = roles.generators.slice(procs=i)
        endpoint = getattr(one, plan.work_endpoint)
        if cfg.run.call_timeout_s:
            endpoint = endpoint.options(timeout=cfg.run.call_timeout_s)
        return serve_work(work, stop, one, f"generator[{i}]",
                          lambda item: endpoint.call_one(*plan.work_args(item, ledger.generation)), recovery,
                          on_result=plan.on_work)

    async def evaluate(version: int, samples: int) -> None:
        try:
            r = await roles.evaluator.evaluate.call_one(*plan.eval_args(version, samples))
        except (rm.ActorDied, rm.ActorError) as exc:  # its proc (or a reward proc it used) died: skip this one
            if isinstance(exc, rm.ActorDied):
                await recovery.wait_back(roles.evaluator, exc, "evaluator")
            return
        recovery.progressed([roles.evaluator], "evaluation")
        if r.policy_version in {e.policy_version for _, e in result.evals}:
            return  # the evaluator had moved on to a version already evaluated: the same answer, not a new one
        result.evals.append((samples, r))
        target = cfg.eval.target
        if target is not None and r.value >= target and result.solved_samples is None:
            result.solved_samples, result.solved_s = samples, time.perf_counter() - start
            stop.set()

    def evaluate_soon(version: int, samples: int) -> None:
        if version not in requested:  # marked now, not when the task first runs: a later check sees it
            requested.add(version)
            pending.append(asyncio.ensure_future(evaluate(version, samples)))

    async def train() -> None:
        every = cfg.eval.every or plan.budget
        next_eval = (plan.progress(result) // every + 1) * every
        if plan.eval_at_start:
            evaluate_soon(result.policy_version, result.samples_seen)
        with RunProgress(plan.budget, str(plan.unit), cfg.run.progress) as bar:
            while plan.progress(result) < plan.budget and not stop.is_set():
                # collecting in the trainer: one call per 5% of the budget at most (a checkpoint and the
                # progress bar each call), none past the next evaluation
                until = min(next_eval, plan.budget, plan.progress(result) + max(plan.budget // 20, 1))
                m = await recovery.train(roles.trainer, roles.buffer, work,
                                         cfg.trainer.rollouts_per_train(max(replicas, 1)), cfg.run.train_timeout_s,
                                         collect=(cfg.generator, until) if plan.collect_in_trainer else None)
                if m is None:  # not enough fresh rollouts yet, or the trainer or buffer died and is back
                    continue
                result.step, result.policy_version, result.samples_seen = m.step, m.policy_version, m.samples_seen
                if plan.on_train is not None:
                    plan.on_train(m)
                if plan.progress(m) >= next_eval:
                    next_eval = (plan.progress(m) // every + 1) * every
                    evaluate_soon(m.policy_version, m.samples_seen)
                bar.update(plan.progress(m), step=m.step, lag=m.max_lag, reward=m.metric(plan.reward_metric),
                           sps=m.samples_seen / (time.perf_counter() - start))
            if not stop.is_set():  # budget spent: the final weights are evaluated (once)
                evaluate_soon(result.policy_version, result.samples_seen)
            await asyncio.gather(*pending)

    loops = [asyncio.ensure_future(replica(i)) for i in range(replicas)]
    await run_with_replicas(train(), loops, stop, work, ledger)
    result.wall_s = time.perf_counter() - start
    result.issued, result.reissued = work.issued, work.reissued
    result.evals.sort(key=lambda e: e[1].policy_version)


def proc_failures_line(c: dict[str, Any]) -> str:
    """``3 died, 3 restarted, median recovery 1.50 s (serving 0.11 s)``: recovery is the fault to the
    replacement's first progress (a train step, a rollout landed), serving the fault to its actors
    re-created; a replacement that made no progress before the run ended counts as restarted only."""
    line = f"{c['proc_deaths']} died, {c['restarts']} restarted"
    if c.get("recoveries"):
        line += f", median recovery {c['median_recovery_s']:.2f} s"
        if c.get("median_serving_s") is not None:
            line += f" (serving {c['median_serving_s']:.2f} s)"
        if c["recoveries"] < c["restarts"]:
            line += f"; {c['restarts'] - c['recoveries']} made no progress before the end"
    elif c["restarts"] and c.get("median_serving_s") is not None:
        line += f", none made progress before the end (median serving {c['median_serving_s']:.2f} s)"
    return line


def summary_rows(result: RunResult, unit: Unit, target: float | None) -> list[tuple[str, str]]:
    """The summary every recipe shows, from telemetry (``result.counts``): the final evaluation is the
    ``evals`` row of the newest version, "solved" the first version whose row reached the target."""
    c = result.counts
    ev = c.get("last_eval")
    rows = [("train steps", str(c["train_steps"])), (f"{unit} trained", str(result.samples_seen)),
            ("rollouts (distinct ids)", f"{c['rollouts']} ({c['distinct_ids']})"),
            ("final eval", f"{ev['metric']} {ev['value']:.3g} (version {ev['policy_version']})" if ev else "none")]
    if target is not None:
        first = c.get("first_reaching")
        solved = "no" if first is None else f"version {first['policy_version']} ({first['value']:.3g} >= {target:g})"
        if first is not None and result.solved_samples is not None:
            solved += f", {result.solved_samples} {unit}, {result.solved_s:.1f} s"
        rows.append(("solved", solved))
    rows += [("wall time", f"{result.wall_s:.1f} s"), ("weight syncs", str(c["weight_syncs"])),
             ("work items", f"{c['work_issued']} issued, {c['work_reissued']} re-issued, "
                            f"{c['work_dropped']} dropped, {c['work_lost']} lost"),
             ("proc failures", proc_failures_line(c)),
             ("peak RSS per proc", proc_memory_line(c.get("proc_memory", [])))]
    return rows
