"""Recipe configs compose from the shipped YAML and fail before anything runs, naming the key and the fix."""

import pytest

from rlmesh.recipes.compose import RecipeConfigError, compose, config_dir
from rlmesh.recipes.recipe_config import GRPORecipeConfig, PPORecipeConfig


def test_presets_compose_to_their_schemas():
    ppo, launcher = compose(["recipe=ppo_cartpole"])
    assert isinstance(ppo, PPORecipeConfig) and launcher == "local"
    grpo, _ = compose(["recipe=grpo_addition"])
    assert isinstance(grpo, GRPORecipeConfig)


def test_overrides_reach_the_dataclasses():
    cfg, _ = compose(["recipe=ppo_cartpole", "trainer.lr=1e-4", "generator.replicas=3", "generator=pendulum"])
    assert cfg.trainer.lr == 1e-4 and cfg.generator.replicas == 3 and cfg.generator.env_id == "Pendulum-v1"


@pytest.mark.parametrize("overrides,message", [
    (["trainer.lrr=1"], r"trainer\.lrr is not a config key: did you mean trainer\.lr\?"),
    (["+trainer.lrr=1"], r"trainer\.lrr is not a config key: did you mean trainer\.lr\?"),
    (["trainer.lr=abc"], r"trainer\.lr: .*could not be converted to Float"),
    (["generator.replicas=1.5"], r"generator\.replicas: .*Integer"),
    (["trainer.lr=-1"], r"trainer\.lr=-1\.0 is invalid: use a positive learning rate"),
    (["generator=nope"], r"generator=nope is not a preset: use one of .*cartpole"),
    (["trainer.num_minibatches=1000"], r"trainer\.num_minibatches=1000 is invalid: a rollout batch of 512"),
    (["buffer.capacity=1", "generator.replicas=2"], r"buffer\.capacity=1 is invalid: hold at least"),
    (["recipe=grpo_addition", "reward=env"], r"reward\.kind='env' is invalid: GRPO on text needs a verifier"),
    (["recipe=grpo_addition", "generator=vllm"], r"model\.path=None is invalid: .*set model\.path"),
    (["recipe=grpo_addition", "prompts_per_step=10", "generator.replicas=3"], r"prompts_per_step=10 is invalid"),
    (["launcher=kubernetes"], r"launcher\.image is required"),
    (["telemetry.flush_interval_s=5"], r"telemetry\.flush_interval_s=5\.0 must be in"),
    # issue 11 item 13: caught here, not 40 s later as a remote traceback from a generator proc
    (["generator.env_id=CartPole-v9"],
     r"^generator\.env_id='CartPole-v9' is not a registered gymnasium environment; did you mean CartPole-v1"),
    (["generator.env_id=Pendulum"], r"generator\.env_id='Pendulum' .*did you mean Pendulum-v1"),
    (["generator.env_id=nosuchpkg:Foo-v0"], r"generator\.env_id='nosuchpkg:Foo-v0' is invalid: cannot import"),
    (["recipe=grpo_addition", "model.path=/no/such/model", "trainer.sft_steps=0"],
     r"model\.path='/no/such/model' is invalid: no such folder"),
    # the LLM checks are one function for GRPO and agentic schemas: the agentic one gained these
    (["recipe=grpo_calculator", "trainer=dapo", "trainer.max_refills=3", "buffer.max_policy_lag=1"],
     r"trainer\.max_refills=3 is invalid: generation runs only buffer\.max_policy_lag=1"),
    (["recipe=grpo_calculator", "generator.samples_per_prompt=1"], r"at least 2 episodes per task"),
    (["recipe=grpo_calculator", "prompts_per_step=1", "generator.replicas=2"], r"prompts_per_step=1 is invalid"),
    # collecting in the trainer: PPO-family trainers, one replica, one rank, no generator to kill
    (["recipe=dqn_cartpole", "generator.in_trainer=true"],
     r"generator\.in_trainer=True is invalid: only PPO-family trainers .* not DQNConfig's"),
    (["recipe=a2c_cartpole", "generator.replicas=2"], r"generator\.replicas=2 is invalid: .*leave generator\.replicas at 1"),
    (["recipe=a2c_cartpole", "trainer.ranks=2"], r"trainer\.ranks=2 is invalid: .*use trainer\.ranks=1"),
    (["recipe=a2c_cartpole", "faults=generator_kill"],
     r"faults\.kill='generator' is not a role of this recipe: use one of buffer, trainer"),
])
def test_bad_configs_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(RecipeConfigError, match=message):
        compose(overrides)


def test_in_trainer_collection_spawns_no_generator_procs():
    a2c, _ = compose(["recipe=a2c_cartpole"])
    assert a2c.generator.in_trainer and a2c.proc_meshes() == {"rl": 2}
    procs, _ = compose(["recipe=a2c_cartpole", "generator.in_trainer=false", "generator.replicas=3"])
    assert procs.proc_meshes() == {"rl": 5}


@pytest.mark.parametrize("overrides,in_trainer", [
    (["recipe=ppo"], True),                                       # PPO, one replica, strictly on-policy
    (["recipe=a2c/CartPole-v1"], True),
    (["recipe=ppo_pendulum"], True),
    (["recipe=ppo", "generator.replicas=2"], False),              # replicas collect in parallel
    (["recipe=ppo_cartpole"], False),                             # one rollout ahead: generation overlaps training
    (["recipe=ppo", "faults=generator_kill"], False),             # a generator to kill
    (["recipe=dqn_cartpole"], False),                             # off-policy
    (["recipe=sac_pendulum"], False),
    (["recipe=ppo", "generator.in_trainer=false"], False),
])
def test_in_trainer_by_default_exactly_where_collecting_and_training_take_turns(overrides, in_trainer):
    cfg, _ = compose(overrides)
    assert cfg.generator.in_trainer is in_trainer


def test_user_config_dir_on_the_search_path(tmp_path):
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "my_cartpole.yaml").write_text(
        "# @package _global_\ndefaults:\n  - ppo_cartpole\n  - _self_\ntrainer:\n  lr: 0.0007\n")
    cfg, _ = compose(["recipe=my_cartpole", f"hydra.searchpath=[file://{tmp_path}]"])
    assert cfg.trainer.lr == 0.0007 and cfg.generator.num_envs == 8


def test_configs_are_found_without_a_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert (config_dir() / "recipe" / "ppo_cartpole.yaml").exists()
    cfg, _ = compose(["recipe=ppo_cartpole"])
    assert cfg.generator.env_id == "CartPole-v1"
