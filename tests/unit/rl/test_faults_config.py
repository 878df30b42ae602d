"""The faults= settings: one schedule per run, roles the recipe has, restarts allowed; bad ones name the key."""

import pytest

from rlmesh.actor.faults import FaultConfig, FaultInjector
from rlmesh.errors import ConfigError
from rlmesh.recipes.compose import RecipeConfigError, compose


def test_kind_and_target_follow_the_key_that_is_set():
    assert (FaultConfig().kind, FaultConfig().target) == ("none", None)
    assert (FaultConfig(kill="trainer").kind, FaultConfig(kill="trainer").target) == ("kill", "trainer")
    assert (FaultConfig(hang="generator").kind, FaultConfig(hang="generator").target) == ("hang", "generator")


@pytest.mark.parametrize("kwargs,key", [
    ({"kill": "generator", "hang": "generator"}, "faults.kill"),
    ({"every_s": 0}, "faults.every_s"),
    ({"start_after_s": -1}, "faults.start_after_s"),
    ({"max_faults": 0}, "faults.max_faults"),
])
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        FaultConfig(**kwargs)


def test_roles_are_checked_against_the_recipe():
    FaultConfig().check_roles({"gen": 1})                 # no faults: nothing to check
    FaultConfig(hang="gen").check_roles({"gen": 1})
    with pytest.raises(ConfigError, match="faults.kill='buffer' is not a role of this recipe: use one of gen, tr"):
        FaultConfig(kill="buffer").check_roles({"gen": 1, "tr": 2})


def test_injector_refuses_unknown_kinds():
    with pytest.raises(ValueError, match="fault kind 'explode'"):
        FaultInjector.__init__(FaultInjector.__new__(FaultInjector), None, kind="explode")


@pytest.mark.parametrize("overrides,message", [
    (["faults.kill=evaluator"], "faults.kill=.evaluator. is not a role of this recipe: use one of buffer, generator, trainer"),
    (["faults=trainer_kill", "run.max_restarts=0"], "run.max_restarts=0 is invalid: faults.kill=trainer kills procs"),
    (["faults.kill=generator", "faults.hang=trainer"], "set one of them"),
])
def test_recipe_configs_refuse_impossible_fault_schedules(overrides, message):
    with pytest.raises(RecipeConfigError, match=message):
        compose(["recipe=ppo_cartpole", *overrides])


def test_presets_compose():
    cfg, _ = compose(["recipe=grpo_addition", "faults=generator_kill", "faults.every_s=4"])
    assert (cfg.faults.kill, cfg.faults.every_s, cfg.faults.seed) == ("generator", 4.0, 1)
    cfg, _ = compose(["recipe=ppo_cartpole", "faults=trainer_kill"])
    assert (cfg.faults.kill, cfg.faults.max_faults, cfg.faults.start_after_s) == ("trainer", 1, 5.0)
    cfg, _ = compose(["recipe=grpo_addition", "faults.kill=reward"])
    assert cfg.faults.target == "reward"
