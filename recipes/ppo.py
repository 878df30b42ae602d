"""PPO on a gymnasium env, with generators, a replay buffer and a trainer in their own procs.

    rlmesh run recipe=ppo_cartpole                      # from any directory
    rlmesh run recipe=ppo_cartpole trainer.lr=1e-3 generator.replicas=2
    python recipes/ppo.py recipe=ppo_cartpole           # the same, from a checkout

The loop, top to bottom: the trainer publishes version 0; each generator replica loops
``collect(work item)`` -> its rollout goes straight to the buffer; the trainer ``train`` s
on batches it samples from the buffer and publishes each new version; an evaluator
scores the greedy policy on fresh envs every ``eval.every`` env steps. Generation runs
ahead of training by at most ``buffer.max_policy_lag`` versions (the work scheduler's
credit), so they overlap without going off-policy beyond that bound.
"""

from __future__ import annotations

import asyncio
import time

import rlmesh as rm
from rlmesh.actor.faults import FaultInjector
from rlmesh.rl.actors import GymGenerator, PPOTrainer, ReplayBuffer
from rlmesh.rl.placement import place
from rlmesh.rl.recipe_config import PPORecipeConfig
from rlmesh.rl.report import RunProgress, print_summary, telemetry_counts
from rlmesh.rl.resilience import (Recovery, RunFailed, WorkLedger, abandon_previous, final_checkpoint,
                                  run_with_replicas, serve_work)
from rlmesh.rl.run_state import begin
from rlmesh.rl.schedule import AsyncWorkScheduler


def main(cfg: PPORecipeConfig, launcher: str = "local", trainer_cls: type = PPOTrainer) -> dict:
    g, t = cfg.generator, cfg.trainer
    cfg.telemetry.apply()
    run = begin(cfg, launcher)  # a new run, or (run.resume) the same run id, database and checkpoints
    ledger = WorkLedger(run.generation)
    abandoned = abandon_previous(rm.telemetry.query, ledger) if run.generation else 0
    restart = cfg.run.restart_policy()  # the budget (N restarts in T s) and every run.*_timeout_s
    procs = place(launcher, cfg.launcher).spawn_procs(per_host={"procs": cfg.proc_meshes()["rl"]}, restart=restart,
                                                     name="rl")
    try:
        # proc 0: buffer + evaluator, proc 1: trainer, procs 2..: one generator each
        buffer = procs.slice(procs=0).spawn("buffer", ReplayBuffer, cfg.buffer)
        evaluator = procs.slice(procs=0).spawn("evaluator", GymGenerator, g)
        trainer = procs.slice(procs=1).spawn("trainer", trainer_cls, t, g.env_id, buffer, seed=cfg.run.seed)
        gens = procs.slice(procs=slice(2, 2 + g.replicas)).spawn("generator", GymGenerator, g, buffer)
        roles = {"generator": gens, "trainer": trainer, "buffer": buffer}  # buffer: its proc hosts the evaluator too
        with FaultInjector.from_config(cfg.faults, roles) as faults:
            try:
                result = asyncio.run(_loop(cfg, gens, trainer, evaluator, buffer, ledger, run.generation))
            except RunFailed as exc:
                final_checkpoint(trainer, buffer, exc)
                raise
        result["faults_injected"] = len(faults.injected)
    finally:
        procs.stop()
    result.update(run_id=run.run_id, abandoned=abandoned, generation=run.generation)
    if run.run_id is None:  # telemetry=off: nothing recorded, nothing to summarise
        return result
    rm.telemetry.flush()
    counts = telemetry_counts(rm.telemetry.query)
    result.update(counts)
    ev = counts["last_eval"]
    print_summary(run.run_id, [
        ("env", g.env_id), ("train steps", str(counts["train_steps"])), ("env steps trained", str(result["env_steps"])),
        ("rollouts (distinct ids)", f"{counts['rollouts']} ({counts['distinct_ids']})"),
        ("final eval", f"{ev['metric']} {ev['value']:.1f} at step {ev['step']}" if ev else "none"),
        ("solved", f"{result['solved_steps']} env steps, {result['solved_s']:.1f} s" if result["solved_s"] else "no"),
        ("wall time", f"{result['wall_s']:.1f} s"), ("weight syncs", str(counts["weight_syncs"])),
        ("work items", f"{counts['work_issued']} issued, {counts['work_reissued']} re-issued, "
                       f"{counts['work_dropped']} dropped, {counts['work_lost']} lost"),
        ("proc failures", f"{counts['proc_deaths']} died, {counts['restarts']} restarted"
                          + (f", median recovery {counts['median_recovery_s']:.2f} s" if counts["restarts"] else "")),
    ])
    return result


async def _loop(cfg: PPORecipeConfig, gens, trainer, evaluator, buffer, ledger: WorkLedger, generation: int) -> dict:
    g, t = cfg.generator, cfg.trainer
    prefix = "rollout-" if generation == 0 else f"rollout-g{generation}-"  # ids never repeat across resumes
    work = AsyncWorkScheduler(per_step=g.replicas, max_policy_lag=cfg.buffer.max_policy_lag, prefix=prefix,
                              on_event=ledger)
    recovery = Recovery(cfg.run.recovery_timeout_s, meshes={"buffer": buffer, "trainer": trainer})
    stop = asyncio.Event()
    start = time.perf_counter()
    resumed = await trainer.state.call_one()  # a resumed run's trainer starts from its checkpoint
    state = {"env_steps": resumed["samples_seen"], "solved_steps": None, "solved_s": None, "evals": []}

    def replica(i: int):
        one = gens.slice(procs=i)
        call = one.collect.options(timeout=cfg.run.call_timeout_s) if cfg.run.call_timeout_s else one.collect
        return serve_work(work, stop, one, f"generator[{i}]", lambda item: call.call_one(item), recovery)

    evaluated: set[int] = set()

    async def evaluate(version: int, env_steps: int) -> None:
        evaluated.add(version)
        try:
            r = await evaluator.evaluate.call_one(cfg.eval.episodes, version, env_steps)
        except rm.ActorDied as exc:  # the evaluator's proc died: this evaluation is skipped, the run goes on
            await recovery.wait_back(evaluator, exc, "evaluator")
            return
        state["evals"].append((env_steps, r["value"]))
        if cfg.eval.target is not None and r["value"] >= cfg.eval.target and state["solved_s"] is None:
            state.update(solved_steps=env_steps, solved_s=time.perf_counter() - start)
            stop.set()

    async def train() -> None:
        evals: list[asyncio.Future] = []
        every = cfg.eval.every or t.total_steps
        next_eval = (state["env_steps"] // every + 1) * every
        m = {"policy_version": resumed["policy_version"]}
        with RunProgress(t.total_steps, "env steps", cfg.run.progress) as bar:
            while state["env_steps"] < t.total_steps and not stop.is_set():
                trained = await recovery.train(trainer, buffer, work, g.replicas, cfg.run.train_timeout_s)
                if trained is None:  # not enough fresh rollouts yet, or the trainer or buffer died and is back
                    continue
                m = trained
                state["env_steps"] = m["samples_seen"]
                if state["env_steps"] >= next_eval:
                    next_eval += every
                    evals.append(asyncio.ensure_future(evaluate(m["policy_version"], state["env_steps"])))
                bar.update(state["env_steps"], step=m["step"], lag=m["max_lag"],
                           reward=m["metrics"].get("charts/episodic_return"),
                           sps=state["env_steps"] / (time.perf_counter() - start))
            if not stop.is_set() and m["policy_version"] not in evaluated:  # budget spent: evaluate the final weights
                evals.append(asyncio.ensure_future(evaluate(m["policy_version"], state["env_steps"])))
            await asyncio.gather(*evals)

    loops = [asyncio.ensure_future(replica(i)) for i in range(g.replicas)]
    await run_with_replicas(train(), loops, stop, work, ledger)
    state["wall_s"] = time.perf_counter() - start
    state["issued"], state["reissued"] = work.issued, work.reissued
    return state


if __name__ == "__main__":  # python recipes/ppo.py [overrides]: the ppo_cartpole recipe unless told otherwise
    import sys

    from rlmesh.recipes_cli import run_main

    args = sys.argv[1:]
    raise SystemExit(run_main(args if any(a.startswith("recipe=") for a in args) else ["recipe=ppo_cartpole", *args]))
