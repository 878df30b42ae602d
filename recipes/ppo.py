"""PPO (or any gym trainer's algorithm) on a gymnasium env: generators, a replay buffer, an
evaluator and a trainer in their own procs.

    rlmesh run recipe=ppo_cartpole                      # from any directory
    rlmesh run recipe=ppo_cartpole trainer.lr=1e-3 generator.replicas=2
    python recipes/ppo.py recipe=ppo_cartpole           # the same, from a checkout

Placement: proc 0 holds the buffer and the evaluator, proc 1 the trainer, procs 2.. one
generator each (none with ``generator.in_trainer``: the trainer steps the envs itself). Each
role's class is the one its config names (``trainer._target_``, chosen by ``trainer=ppo`` or a
plugin's config). The loop (:mod:`rlmesh.recipes.loop`): each
generator replica ``collect`` s one rollout per work item straight into the buffer; the trainer
trains on what it samples there and publishes each new version; the evaluator scores the greedy
policy on fresh envs every ``eval.every`` env steps. The algorithm's update is the trainer's
``train_step`` (``rlmesh/rl/algorithms/ppo.py`` for PPO).
"""

from __future__ import annotations

from rlmesh.errors import ConfigError
from rlmesh.recipes.loop import Plan, Roles, RunResult, Unit, run_recipe
from rlmesh.recipes.recipe_config import PPORecipeConfig
from rlmesh.rl.run.placement import actor_class, check_target


def main(cfg: PPORecipeConfig, launcher: str = "local") -> RunResult:
    g, t = cfg.generator, cfg.trainer
    # each role's class comes from its config (`_target_`): checked before any proc starts, imported
    # (torch) in spawn(), while the procs start
    roles = {"generator": g, "trainer": t, "buffer": cfg.buffer, **({"eval": cfg.eval} if cfg.eval._target_ else {})}
    for key, role in roles.items():
        check_target(role, key)

    def spawn(procs) -> Roles:
        generator_cls, trainer_cls = actor_class(g, "generator"), actor_class(t, "trainer")
        if g.in_trainer and not hasattr(trainer_cls, "collect_and_train"):
            raise ConfigError(f"generator.in_trainer=True is invalid: {trainer_cls.__name__} cannot collect its own "
                              "rollouts (collect_and_train: PPOTrainer and its subclasses); use generator.in_trainer=false")
        buffer_cls = actor_class(cfg.buffer, "buffer")
        evaluator_cls = actor_class(cfg.eval, "eval") if cfg.eval._target_ else generator_cls
        buffer = procs.slice(procs=0).spawn("buffer", buffer_cls, cfg.buffer)
        evaluator = procs.slice(procs=0).spawn("evaluator", evaluator_cls, g)
        trainer = procs.slice(procs=1).spawn("trainer", trainer_cls, t, g.env_id, buffer, seed=cfg.run.seed)
        if g.in_trainer:  # the trainer steps the envs itself (collect_and_train): no generator procs
            return Roles(None, trainer, buffer, evaluator)
        generators = procs.slice(procs=slice(2, 2 + g.replicas)).spawn("generator", generator_cls, g, buffer)
        return Roles(generators, trainer, buffer, evaluator)

    plan = Plan(budget=t.total_steps, unit=Unit.ENV_STEPS, work_endpoint="collect",
                collect_in_trainer=bool(g.in_trainer), work_args=lambda item, generation: (item,),
                eval_args=lambda version, env_steps: (cfg.eval.episodes, version, env_steps),
                summary=lambda result: [("env", g.env_id)])
    return run_recipe(cfg, launcher, spawn, plan)


if __name__ == "__main__":  # python recipes/ppo.py [overrides]: the ppo_cartpole recipe unless told otherwise
    import sys

    from rlmesh.recipes.cli import run_main

    args = sys.argv[1:]
    raise SystemExit(run_main(args if any(a.startswith("recipe=") for a in args) else ["recipe=ppo_cartpole", *args]))
