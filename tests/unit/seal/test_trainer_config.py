"""The typed trainer group (seal/config.py TrainerConfig): the YAML's values, and one line for each bad one."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from omegaconf import OmegaConf

from seal.config import GeneratorConfig, LearnerGroupConfig, TrainerConfig, compose, config_dir, recorded_trainer

YAML_TRAINER = yaml.safe_load((config_dir() / "config.yaml").read_text())["trainer"]


def values(**changes):
    return {**YAML_TRAINER, **changes}


def test_the_yaml_sets_every_field_and_no_other():
    assert set(YAML_TRAINER) == {f.name for f in dataclasses.fields(TrainerConfig)}
    # No field has a default of its own: configs/config.yaml is the one place a value is written.
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(TrainerConfig)
    )


def test_defaults_are_the_yamls():
    t = TrainerConfig.of(compose([]))
    assert dataclasses.asdict(t) == {**YAML_TRAINER, "reissue_after_s": float(YAML_TRAINER["reissue_after_s"])}
    assert (t.mode, t.steps, t.groups_per_step, t.max_staleness, t.filter_groups, t.unfilled) == (
        "async",
        5,
        2,
        1,
        "zero_variance",
        "skip",
    )
    assert (t.checkpoint_every, t.checkpoint_keep, t.snapshot_every, t.storage) == (5, 2, 0, None)
    assert (t.weight_canary, t.canary_max_logprob_diff, t.fill_patience, t.oversample) == (True, 1.0, 3, 1)
    assert isinstance(t.reissue_after_s, float) and not t.sync and t.staleness == 1
    assert (t.min_group_size, t.episode_deadline_s, t.admission_oversample) == (None, None, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.steps = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides, check",
    [
        (["trainer.steps=7", "trainer.groups_per_step=4"], lambda t: (t.steps, t.groups_per_step) == (7, 4)),
        (["trainer.mode=sync", "trainer.max_staleness=0"], lambda t: t.sync and t.staleness == 0),
        # sync mode generates what it trains: the oversample setting is async's
        (["trainer.mode=sync", "trainer.oversample=2"], lambda t: t.oversample == 2 and t.admission_oversample == 0),
        (["trainer.episode_deadline_s=90"], lambda t: t.episode_deadline_s == 90.0),
        (
            ["trainer.mode=sync"],
            lambda t: t.sync and t.staleness == 0 and t.max_staleness == 1,
        ),  # sync ignores the bound
        (
            ["trainer.filter_groups=none", "trainer.unfilled=partial"],
            lambda t: (t.filter_groups, t.unfilled) == ("none", "partial"),
        ),
        (
            ["trainer.storage=/shared/seal", "trainer.checkpoint_every=0"],
            lambda t: (t.storage, t.checkpoint_every) == ("/shared/seal", 0),
        ),
        (
            ["trainer.snapshot_every=2", "trainer.checkpoint_keep=0"],
            lambda t: (t.snapshot_every, t.checkpoint_keep) == (2, 0),
        ),
        (
            ["trainer.canary_max_logprob_diff=2", "trainer.weight_canary=false"],
            lambda t: t.canary_max_logprob_diff == 2.0 and not t.weight_canary,
        ),
        (["recipe=qwen7b_1x8"], lambda t: (t.groups_per_step, t.checkpoint_every) == (32, 10)),
        (["algo=seal_release"], lambda t: t.filter_groups == "none"),
        (["ablation=no_closed_loop"], lambda t: t.closed_loop is False),
    ],
)
def test_overrides_recipes_and_ablations_reach_it(overrides, check):
    assert check(TrainerConfig.of(compose(overrides)))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"mode": "overlapped"}, "trainer.mode must be sync or async, got 'overlapped'"),
        ({"mode": "async", "max_staleness": 0}, "trainer.mode=async needs trainer.max_staleness >= 1 (0 is sync mode)"),
        ({"steps": 0}, "trainer.steps must be >= 1, got 0"),
        ({"groups_per_step": 0}, "trainer.groups_per_step must be >= 1, got 0"),
        ({"steps": "ten"}, "trainer.steps must be an integer, got 'ten'"),
        ({"groups_per_step": 2.0}, "trainer.groups_per_step must be an integer, got 2.0"),
        ({"max_staleness": True}, "trainer.max_staleness must be an integer, got True"),
        ({"stale_policy": "keep"}, "trainer.stale_policy must be drop or downweight, got 'keep'"),
        ({"reissue_after_s": 0}, "trainer.reissue_after_s must be > 0, got 0.0"),
        ({"reissue_after_s": "soon"}, "trainer.reissue_after_s must be a number, got 'soon'"),
        ({"checkpoint_every": -1}, "trainer.checkpoint_every must be >= 0 (0: never), got -1"),
        ({"checkpoint_keep": -1}, "trainer.checkpoint_keep must be >= 0 (0: keep all), got -1"),
        ({"snapshot_every": -2}, "trainer.snapshot_every must be >= 0 (0: A_0 and the end of each run only), got -2"),
        ({"storage": 3}, "trainer.storage must be a path or null, got 3"),
        ({"closed_loop": "yes"}, "trainer.closed_loop must be true or false, got 'yes'"),
        ({"skip_overlong": 1}, "trainer.skip_overlong must be true or false, got 1"),
        ({"filter_groups": "all"}, "trainer.filter_groups must be none or zero_variance, got 'all'"),
        ({"oversample": -1}, "trainer.oversample must be >= 0, got -1"),
        ({"min_group_size": 0}, "trainer.min_group_size must be >= 1 (null: the whole group), got 0"),
        ({"min_group_size": 2.5}, "trainer.min_group_size must be an integer or null, got 2.5"),
        ({"episode_deadline_s": 0}, "trainer.episode_deadline_s must be > 0, got 0.0"),
        ({"episode_deadline_s": "1m"}, "trainer.episode_deadline_s must be a number of seconds or null, got '1m'"),
        ({"fill_patience": 0}, "trainer.fill_patience must be >= 1 (batches of filtered groups), got 0"),
        ({"unfilled": "wait"}, "trainer.unfilled must be skip or partial, got 'wait'"),
        ({"canary_max_logprob_diff": 0}, "trainer.canary_max_logprob_diff must be > 0, got 0.0"),
    ],
)
def test_each_bad_value_is_one_line_naming_the_key(changes, message):
    with pytest.raises(ValueError) as info:
        TrainerConfig.from_mapping(values(**changes))
    assert str(info.value) == message


def test_an_unknown_key_is_refused_and_a_missing_one_named():
    with pytest.raises(ValueError, match=r"^trainer.nope is not a trainer setting \(they are: mode, steps, "):
        TrainerConfig.from_mapping(values(nope=1))
    with pytest.raises(ValueError, match=r"^trainer.nope is not a trainer setting"):
        TrainerConfig.of(compose(["+trainer.nope=1"]))  # hydra adds it; the typed config refuses it
    partial = values()
    del partial["fill_patience"]
    with pytest.raises(
        ValueError, match=r"^trainer.fill_patience is not set \(configs/config.yaml sets every trainer setting\)$"
    ):
        TrainerConfig.from_mapping(partial)


def test_a_recorded_run_reads_with_todays_values_for_what_it_predates():
    """An older run's config.yaml may lack a later setting or hold a retired one (evaluation reads it)."""
    old = {k: v for k, v in YAML_TRAINER.items() if k not in ("weight_canary", "canary_max_logprob_diff")}
    node = OmegaConf.create({"trainer": {**old, "steps": 40, "max_filtered_per_step": 8}}).trainer
    t = TrainerConfig.from_mapping(recorded_trainer(node))
    assert t.steps == 40 and t.weight_canary is YAML_TRAINER["weight_canary"]


def test_the_pipeline_checks_refuse_what_the_learner_group_cannot_do():
    from seal.run.pipeline import check_pipeline_config

    assert check_pipeline_config(compose([])).trainer == TrainerConfig.of(compose([]))
    with pytest.raises(ValueError, match="needs a DeepSpeed learner"):
        check_pipeline_config(compose(["learner=torch", "learner.world_size=2"]))
    with pytest.raises(ValueError, match="trainer.mode must be sync or async"):
        check_pipeline_config(compose(["trainer.mode=both"]))
    with pytest.raises(ValueError, match="^trainer.min_group_size=7 is more than a group's n=6 rollouts$"):
        check_pipeline_config(compose(["trainer.min_group_size=7"]))


def test_the_learner_group_and_the_fleet_are_typed_and_a_key_not_set_is_one_line():
    cfg = compose([])
    assert (LearnerGroupConfig.of(cfg).world_size, LearnerGroupConfig.of(cfg).device) == (1, "cpu")
    assert (GeneratorConfig.of(cfg).replicas, GeneratorConfig.of(cfg).update_timeout_s) == (1, 600.0)
    assert GeneratorConfig.of(compose(["generator=vllm_cpu"])).update_timeout_s is None  # a blocking engine
    with pytest.raises(ValueError, match=r"^learner.world_size must be >= 1 \(learner ranks\), got 0$"):
        LearnerGroupConfig.of(compose(["learner.world_size=0"]))
    with pytest.raises(ValueError, match=r"^learner.cfg.device is not set \(each learner option"):
        LearnerGroupConfig.of(compose(["~learner.cfg.device"]))
    with pytest.raises(ValueError, match=r"^generator.replicas is not set \(each generator option"):
        GeneratorConfig.of(compose(["~generator.replicas"]))
    with pytest.raises(ValueError, match=r"^generator.weight_sync must be reload or broadcast, got 'nccl'$"):
        GeneratorConfig.of(compose(["generator.weight_sync=nccl"]))


def test_a_recorded_run_without_the_group_settings_reads_as_it_ran(tmp_path):
    from seal.config import python_path
    from seal.run.run_dir import PREDATED, recorded_config

    cfg = compose([])
    OmegaConf.set_struct(cfg, False)
    for key in PREDATED:
        parent, _, name = key.rpartition(".")
        del (cfg[parent] if parent else cfg)[name]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    recorded = recorded_config(tmp_path)
    assert LearnerGroupConfig.of(recorded) == LearnerGroupConfig.of(compose([]))
    assert GeneratorConfig.of(recorded) == GeneratorConfig.of(compose([]))
    assert python_path(recorded) == []


def test_a_run_recorded_before_the_modules_moved_finds_its_classes_again():
    """RUN_DIR/config.yaml of a run from before the layout change names the old module paths."""
    from omegaconf import OmegaConf

    from seal.config import rebase_targets

    recorded = OmegaConf.create(
        {
            "evaluation": {"_target_": "evaluation.views.EvalConfig", "validation_size": 8},
            "generator": {"_target_": "actors.vllm_generator.VllmGenerator", "max_model_len": 512},
            "learner": {
                "_target_": "learner.engine.Learner",
                "cfg": {"_target_": "learner.engine.LearnerConfig", "loss": {"_target_": "learner.loss.LossConfig"}},
            },
            "tag_weights": {
                "_target_": "learner.tag_weights.TagWeights",
                "cfg": {"_target_": "learner.tag_weights.DynamicWeightConfig"},
            },
            "env": {"_target_": "no_such_package.NoSuchEnv"},
        }
    )
    assert rebase_targets(recorded) == 4
    assert recorded.evaluation._target_ == "evaluation.config.EvalConfig" and recorded.evaluation.validation_size == 8
    assert recorded.generator._target_ == "actors.generation.vllm_engine.VllmGenerator"
    assert recorded.learner.cfg.loss._target_ == "learner.loss.LossConfig"  # never moved: kept
    assert recorded.tag_weights._target_ == "actors.coordinator.tag_weights.TagWeights"
    assert recorded.tag_weights.cfg._target_ == "actors.coordinator.tag_weights.DynamicWeightConfig"
    assert recorded.env._target_ == "no_such_package.NoSuchEnv"  # nothing of that name today: its own error later


@pytest.mark.parametrize(
    "overrides, says",
    [
        ([], "is the reference only under LoRA"),
        (["learner.cfg.lora.rank=8", "learner.cfg.lora.publish=merged"], "needs learner.cfg.lora.publish=adapter"),
        (["learner.cfg.lora.rank=8", "learner.cfg.loss.kl_coef=0"], "there is no KL term"),
    ],
)
def test_the_reference_from_the_generator_is_refused_where_it_is_not_the_base(overrides, says):
    from seal.run.pipeline import check_pipeline_config

    with pytest.raises(ValueError, match=f"^trainer.reference_logprobs=generator takes .*{says}"):
        check_pipeline_config(compose(["trainer.reference_logprobs=generator", *overrides]))
    settings = check_pipeline_config(compose(["trainer.reference_logprobs=generator", "learner.cfg.lora.rank=8"]))
    assert settings.trainer.reference_logprobs == "generator"
