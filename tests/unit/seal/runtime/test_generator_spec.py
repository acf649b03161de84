"""The generator group's settings: engines are known by type, not by class path."""

import pytest

from actors.generation.async_vllm_engine import AsyncVllmGenerator
from seal.runtime.generator_spec import check_fleet_spec, is_async_engine, local_generator_spec


class UsersAsyncEngine(AsyncVllmGenerator):
    """A user's own async engine: a subclass, living outside the project's packages."""


USERS = f"{__name__}.UsersAsyncEngine"


def test_a_subclass_of_the_async_engine_is_an_async_engine():
    assert is_async_engine("actors.generation.async_vllm_engine.AsyncVllmGenerator")
    assert is_async_engine(USERS)
    assert not is_async_engine("actors.generation.vllm_engine.VllmGenerator")
    assert not is_async_engine(None)


def test_the_async_settings_of_a_users_subclass_are_accepted_and_checked():
    assert check_fleet_spec({"_target_": USERS, "update_mode": "keep", "replicas": 2})["update_mode"] == "keep"
    with pytest.raises(ValueError, match="update_mode must be one of"):
        check_fleet_spec({"_target_": USERS, "update_mode": "sometimes", "replicas": 1})
    with pytest.raises(ValueError, match="needs the async engine"):
        check_fleet_spec(
            {"_target_": "actors.generation.vllm_engine.VllmGenerator", "update_mode": "keep", "replicas": 1}
        )


def test_a_target_that_names_no_class_is_one_clear_error():
    with pytest.raises(ValueError, match="does not name a class"):
        is_async_engine("no.such.module.Engine")


def test_a_users_async_engine_maps_to_the_blocking_engine_for_evaluation():
    from omegaconf import OmegaConf

    spec = local_generator_spec(
        OmegaConf.create({"_target_": USERS, "update_mode": "pause", "model_path": "m", "replicas": 2})
    )
    assert spec == {"_target_": "actors.generation.vllm_engine.VllmGenerator", "model_path": "m"}
