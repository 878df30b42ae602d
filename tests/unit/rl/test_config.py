"""Config validation: a bad value fails at construction and the message names key and fix."""

import dataclasses

import pytest

from rlmesh.rl import config as C
from rlmesh.recipes import recipe_config as R


@pytest.mark.parametrize(
    "factory,kwargs,key",
    [
        (C.PPOConfig, {"lr": 0}, "trainer.lr"),
        (C.PPOConfig, {"gamma": 1.5}, "trainer.gamma"),
        (C.PPOConfig, {"gae_lambda": -0.1}, "trainer.gae_lambda"),
        (C.PPOConfig, {"num_minibatches": 0}, "trainer.num_minibatches"),
        (C.PPOConfig, {"target_kl": 0.0}, "trainer.target_kl"),
        (C.GRPOConfig, {"clip_coef_high": 0.1}, "trainer.clip_coef_high"),
        (C.GRPOConfig, {"kl_coef": -1}, "trainer.kl_coef"),
        (C.GRPOConfig, {"aggregation": "sum"}, "trainer.aggregation"),
        (C.LLMGeneratorConfig, {"backend": "tgi"}, "generator.backend"),
        (C.LLMGeneratorConfig, {"top_p": 0.0}, "generator.top_p"),
        (C.LLMGeneratorConfig, {"temperature": 0.0}, "generator.temperature"),
        (C.GymGeneratorConfig, {"num_envs": 0}, "generator.num_envs"),
        (C.BufferConfig, {"max_policy_lag": -1}, "buffer.max_policy_lag"),
        (C.RewardConfig, {"format_reward": 1.0}, "reward.format_reward"),
        (C.TrainerConfig, {"publish_every": 0}, "trainer.publish_every"),
    ],
)
def test_invalid_values_name_the_key(factory, kwargs, key):
    with pytest.raises(C.ConfigError, match=key.replace(".", r"\.")) as info:
        factory(**kwargs)
    assert "invalid:" in str(info.value)  # followed by the fix


def test_impossible_combination_is_caught():
    with pytest.raises(C.ConfigError, match=r"trainer\.num_minibatches"):
        R.PPORecipeConfig(generator=C.GymGeneratorConfig(num_envs=1, num_steps=2),
                          trainer=C.PPOConfig(num_minibatches=4))
    with pytest.raises(C.ConfigError, match=r"generator\.samples_per_prompt"):
        R.GRPORecipeConfig(generator=C.LLMGeneratorConfig(samples_per_prompt=1))
    with pytest.raises(C.ConfigError, match=r"reward\.kind"):
        R.GRPORecipeConfig(reward=C.RewardConfig(kind="env"))


def test_defaults_are_valid_and_every_field_is_documented():
    import inspect

    for cls in (C.GymGeneratorConfig, C.LLMGeneratorConfig, C.PPOConfig, C.GRPOConfig, C.TrainerConfig,
                C.RewardConfig, C.BufferConfig):
        cls()
        for f in dataclasses.fields(cls):
            owner = next(k for k in cls.__mro__ if f.name in vars(k).get("__annotations__", {}))
            after = inspect.getsource(owner).split(f"    {f.name}:", 1)[1].split("\n", 2)[1].strip()
            assert after.startswith('"""'), f"{cls.__name__}.{f.name} has no docstring"
    from rlmesh.recipes.compose import compose

    preset, _ = compose(["recipe=ppo_cartpole"])
    assert preset.generator.env_id == "CartPole-v1" and preset.trainer.gamma == 0.98
    assert C.PPOConfig().publish_every == 1  # algorithm configs extend TrainerConfig


def test_configs_are_hydra_structured_configs_and_overrides_are_validated():
    from omegaconf import OmegaConf

    for cls in (C.GymGeneratorConfig, C.LLMGeneratorConfig, C.PPOConfig, C.GRPOConfig, C.TrainerConfig,
                C.RewardConfig, C.BufferConfig, R.PPORecipeConfig, R.GRPORecipeConfig):
        assert isinstance(OmegaConf.to_object(OmegaConf.structured(cls)), cls)
    cfg = OmegaConf.merge(OmegaConf.structured(R.PPORecipeConfig), OmegaConf.from_dotlist(["trainer.lr=0.001"]))
    assert OmegaConf.to_object(cfg).trainer.lr == 0.001
    bad = OmegaConf.merge(OmegaConf.structured(R.PPORecipeConfig), OmegaConf.from_dotlist(["trainer.gamma=2.0"]))
    with pytest.raises(C.ConfigError, match=r"trainer\.gamma"):
        OmegaConf.to_object(bad)
