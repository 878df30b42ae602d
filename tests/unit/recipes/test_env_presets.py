"""Tuned presets per environment: every shipped one composes and validates, and ``recipe=<algo>`` picks the
preset for its env (or says there is none), in one line, before anything runs. No training here."""

import importlib.util

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rlmesh.recipes.compose import RecipeConfigError, compose, config_dir, validate
from rlmesh.recipes.config_store import register
from rlmesh.recipes.env_presets import source_of
from rlmesh.rl.algorithms.configs import A2CConfig, DQNConfig
from rlmesh.rl.algorithms.configs.sac import SACConfig
from rlmesh.rl.config import PPOConfig

ALGOS = {"ppo": PPOConfig, "a2c": A2CConfig, "dqn": DQNConfig, "sac": SACConfig}
PRESETS = sorted((f.parent.name, f.stem) for algo in ALGOS for f in (config_dir() / "recipe" / algo).glob("*.yaml"))


@pytest.fixture
def box2d_found(monkeypatch):
    """Box2D and MuJoCo found, installed or not: these tests compose and validate the Box2D and MuJoCo
    presets, and nothing here makes an env (the test suite installs neither; their absence is tested below)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("Box2D", "mujoco") else real(name, *a))


def test_every_standard_env_has_its_presets():
    classic = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1"]
    box2d = ["LunarLander-v3", "LunarLanderContinuous-v3", "BipedalWalker-v3"]
    discrete = {"CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3"}
    expected = {(a, e) for a in ("ppo", "a2c") for e in classic + box2d} | {("dqn", e) for e in discrete}
    sac = {("sac", e) for e in ("Pendulum-v1", "MountainCarContinuous-v0", "LunarLanderContinuous-v3",
                                "BipedalWalker-v3", "Hopper-v5", "HalfCheetah-v5")}  # every continuous zoo entry
    assert expected | sac <= set(PRESETS)


@pytest.mark.timeout(300)  # ~2.5 s of CPU for 20 composes; a hang bound that a loaded host cannot reach
def test_every_preset_names_its_source_and_validates(box2d_found):
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):  # one Hydra context for all: ~0.1 s each
        for algo, env_id in PRESETS:
            text = (config_dir() / "recipe" / algo / f"{env_id}.yaml").read_text()
            assert source_of(text) in ("rl-baselines3-zoo", "CleanRL"), f"{algo}/{env_id}: no '# source:' line"
            cfg = validate(hydra_compose("config", overrides=[f"recipe={algo}/{env_id}"]))  # every __post_init__
            assert cfg.generator.env_id == env_id, f"{algo}/{env_id} steps {cfg.generator.env_id}"
            assert type(cfg.trainer) is ALGOS[algo], f"{algo}/{env_id} trains with {type(cfg.trainer).__name__}"
    GlobalHydra.instance().clear()


def test_algorithm_recipe_picks_the_env_preset_and_says_so(capsys, box2d_found):
    cfg, _ = compose(["recipe=ppo", "generator.env_id=LunarLander-v3", "trainer.lr=1e-3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlmesh: using preset ppo/LunarLander-v3 from rl-baselines3-zoo"]
    assert cfg.generator.num_envs == 16 and cfg.generator.num_steps == 1024 and cfg.trainer.gamma == 0.999
    assert cfg.trainer.lr == 1e-3  # the command line still wins over the preset


def test_algorithm_recipe_without_a_preset_says_so_and_keeps_the_defaults(capsys):
    cfg, _ = compose(["recipe=a2c", "generator.env_id=CartPole-v0"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rlmesh: no tuned preset a2c/CartPole-v0 (presets for a2c: Acrobot-v1, ")
    assert line.endswith("running with A2CConfig's defaults")
    defaults = A2CConfig()
    assert cfg.trainer.lr == defaults.lr and cfg.trainer.total_steps == defaults.total_steps
    assert cfg.generator.env_id == "CartPole-v0" and cfg.generator.num_steps == 5


def test_a_named_recipe_is_not_redirected(capsys):
    cfg, _ = compose(["recipe=ppo_cartpole", "generator.env_id=Acrobot-v1"])
    assert capsys.readouterr().err == "" and cfg.trainer.lr == 2e-3


def test_a_new_algorithms_presets_plug_in_from_the_search_path(tmp_path, capsys):
    """What SAC or TD3 (or a user's algorithm) adds: recipe/<algo>.yaml and recipe/<algo>/<env>.yaml."""
    (tmp_path / "recipe" / "myalgo").mkdir(parents=True)
    (tmp_path / "recipe" / "myalgo.yaml").write_text("# @package _global_\ndefaults:\n  - /recipe/ppo\n  - _self_\n")
    (tmp_path / "recipe" / "myalgo" / "Acrobot-v1.yaml").write_text(
        "# @package _global_\n# source: CleanRL, ppo.py\ndefaults:\n  - /recipe/myalgo\n  - _self_\n"
        "generator:\n  env_id: Acrobot-v1\ntrainer:\n  lr: 0.0042\n")
    search = f"hydra.searchpath=[file://{tmp_path}]"
    cfg, _ = compose(["recipe=myalgo", "generator.env_id=Acrobot-v1", search])
    assert cfg.trainer.lr == 0.0042
    assert capsys.readouterr().err.strip() == "rlmesh: using preset myalgo/Acrobot-v1 from CleanRL"


@pytest.mark.parametrize("text,source", [("# @package _global_\n# source: rl-baselines3-zoo, a2c.yml\n", "rl-baselines3-zoo"),
                                         ("# no source here\n", "")])
def test_source_line(text, source):
    assert source_of(text) == source


@pytest.mark.parametrize("recipe,env_id,package,extra", [("ppo/LunarLander-v3", "LunarLander-v3", "Box2D", "box2d"),
                                                           ("sac/Hopper-v5", "Hopper-v5", "mujoco", "mujoco")])
def test_an_env_without_its_simulator_names_the_extra(monkeypatch, recipe, env_id, package, extra):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    with pytest.raises(RecipeConfigError, match=rf"generator\.env_id='{env_id}' needs {package}, which is not "
                                                rf"installed: pip install 'rlmesh\[{extra}\]'"):
        compose([f"recipe={recipe}"])
    compose(["recipe=ppo/Acrobot-v1"])  # classic control needs nothing more


def test_cfg_job_prints_the_presets_config(capsys):
    from rlmesh.recipes.sweep import hydra_app  # deferred: Hydra's application, only this test runs it

    assert hydra_app(["recipe=ppo", "generator.env_id=Acrobot-v1", "--cfg", "job"]) == 0
    out = capsys.readouterr()
    assert "rlmesh: using preset ppo/Acrobot-v1 from rl-baselines3-zoo" in out.err
    assert "num_steps: 256" in out.out and "gae_lambda: 0.94" in out.out
