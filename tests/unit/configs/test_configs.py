"""Every config file composes; each group's node fits its component's constructor."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hydra.utils import get_class, get_method
from omegaconf import OmegaConf

from seal.config import compose, config_dir, instantiate

GROUP_FILES = sorted(p for p in config_dir().glob("*/*.yaml"))
# Constructors cheap enough to run here; the generator starts an engine.
CHEAP = {"env", "interface", "sampling", "tag_weights", "cluster", "transport", "guideline_policy"}
EXTRA = {("model", "local"): ["model.path=/models/some-model"]}


def test_there_are_config_groups():
    assert {p.parent.name for p in GROUP_FILES} >= {
        "env",
        "interface",
        "model",
        "generator",
        "sampling",
        "learner",
        "tag_weights",
        "cluster",
        "transport",
        "guideline_policy",
    }


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_group_option_composes_and_fits_its_constructor(path: Path):
    group, option = path.parent.name, path.stem
    cfg = compose([f"{group}={option}", *EXTRA.get((group, option), [])])
    node = OmegaConf.to_container(cfg[group], resolve=True)
    assert node, f"{group}/{option} is empty"
    target = node.pop("_target_", None)
    if group == "generator":  # the fleet's setting (seal/runtime/generator_fleet.py), not the engine's
        from seal.runtime.generator_spec import split_generator_spec

        node, replicas = split_generator_spec(node)
        assert replicas == 1
    if target is None:  # plain settings group, read by others through interpolation
        return
    try:
        ctor = get_class(target)
    except Exception:
        ctor = get_method(target)
    inspect.signature(ctor).bind(**node)  # every key is a constructor parameter
    for key, value in node.items():  # nested component configs too (learner.cfg, its loss and apatch)
        if isinstance(value, dict) and "_target_" in value:
            nested = dict(value)
            inspect.signature(get_class(nested.pop("_target_"))).bind(**{k: v for k, v in nested.items()})
    if group == "learner":
        cfg_node = instantiate(cfg.learner.cfg)  # the config objects themselves are cheap
        assert cfg_node.loss.kl_coef == 0.001 and cfg_node.apatch.apply_to == "all"
        assert (cfg_node.apatch.scale_min, cfg_node.apatch.scale_max) == (0.5, 2.0)  # the release's clip range
    if group in CHEAP:
        assert type(instantiate(cfg[group])).__name__ == ctor.__name__


def test_generator_configs_take_the_model_group():
    cfg = compose(["model=tiny"])
    assert cfg.generator.model_path == "tiny" and cfg.generator.max_model_len == cfg.model.max_model_len


def test_root_config_defaults():
    cfg = compose([])
    # The CPU default trains on the built-in shopping env (docs/main-job.md: BFCL gives SmolLM2-135M no reward to learn from).
    assert (
        cfg.split == "train"
        and cfg.env._target_ == "env_pool.shopping.env.ShoppingEnv"
        and cfg.env.tool_format == "python"
    )
    assert cfg.trainer.filter_groups == "zero_variance"
    assert compose(["env=bfcl"]).env.tool_format == "json"
    assert cfg.learner.cfg.mini_batch_groups == cfg.trainer.groups_per_step and cfg.learner.group_size == cfg.n
    assert instantiate(cfg.interface).schema_lite is True and instantiate(cfg.interface).worked_examples is True
    assert instantiate(compose(["interface=raw"]).interface).is_raw
    assert instantiate(compose(["sampling=eval"]).sampling).temperature == 0.0  # evaluation stays greedy
    assert (cfg.sampling.temperature, cfg.sampling.max_new_tokens) == (0.7, 48)  # the CPU default's sampling group


def test_bad_overrides_are_clear_errors():
    with pytest.raises(ValueError, match=r"env=nope: no such option \(the env options are bfcl shopping"):
        compose(["env=nope"])
    with pytest.raises(ValueError, match="tool_format"):
        instantiate(compose(["env.tool_format=xml"]).env)
    with pytest.raises(ValueError, match="temperature"):
        instantiate(compose(["sampling.temperature=-1"]).sampling)
    with pytest.raises(ValueError, match=r"0 < scale_min <= scale_max, got \[2.5, 2.0\]"):
        instantiate(compose(["learner.cfg.apatch.scale_min=2.5"]).learner.cfg)
    with pytest.raises(ValueError, match="min_prevalence must be in"):
        instantiate(compose(["guideline_policy.min_prevalence=10"]).guideline_policy)
    for env in ("bfcl", "toy", "shopping"):
        with pytest.raises(
            ValueError, match="diagnosis.instance_mismatch must be one of release, classes, got 'scope'"
        ):
            instantiate(compose([f"env={env}", "diagnosis.instance_mismatch=scope"]).env)


@pytest.mark.parametrize("env", ["bfcl", "toy", "shopping"])
def test_instance_mismatch_rule_reaches_the_env(env):
    assert instantiate(compose([f"env={env}"]).env).instance_mismatch == "release"
    assert (
        instantiate(compose([f"env={env}", "diagnosis.instance_mismatch=classes"]).env).instance_mismatch == "classes"
    )


def test_algo_recipes_set_what_they_say():
    release = compose(["algo=seal_release"])
    lc, iface = instantiate(release.learner.cfg), instantiate(release.interface)
    assert (iface.schema_lite, iface.error_feedback, iface.guidelines, iface.worked_examples) == (
        True,
        False,
        False,
        False,
    )
    assert (lc.old_logprobs, lc.loss_agg, lc.loss.is_level, lc.weight_decay) == (
        "recompute",
        "seq-mean-token-mean",
        "none",
        0.01,
    )
    assert release.trainer.filter_groups == "none"
    paper = compose(["algo=seal_paper"])
    lc, iface = instantiate(paper.learner.cfg), instantiate(paper.interface)
    assert (iface.schema_lite, iface.error_feedback, iface.guidelines, iface.worked_examples) == (
        True,
        True,
        True,
        False,
    )
    assert (lc.old_logprobs, lc.loss_agg) == ("behaviour", "token-mean")
    # An ablation still applies on top of an algo (it comes later in the defaults list).
    both = compose(["algo=seal_paper", "ablation=no_reweighting"])
    assert both.algo.name == "seal_paper" and instantiate(both.learner.cfg).apatch.enabled is False


def test_off_policy_and_sampling_defaults():
    cfg = compose([])
    lc = instantiate(cfg.learner.cfg)
    assert (lc.old_logprobs, lc.loss_agg, lc.loss.is_level, lc.loss.is_mode, lc.loss.is_threshold) == (
        "recompute",
        "token-mean",
        "token",
        "truncate",
        2.0,
    )
    assert cfg.trainer.filter_groups == "zero_variance" and cfg.trainer.unfilled == "skip"
    with pytest.raises(ValueError, match="old_logprobs"):
        instantiate(compose(["learner.cfg.old_logprobs=vllm"]).learner.cfg)


@pytest.mark.parametrize("generator", ["vllm_cpu", "vllm_async_cpu", "vllm_gpu", "vllm_async_gpu"])
def test_every_generator_config_maps_to_a_blocking_engine_it_can_build(generator):
    """`seal evaluate`, `seal rollout` and the closing evaluation of `seal train` build a blocking
    engine from whatever generator the run trains with: every key must be one it takes."""
    import inspect

    from actors.generation.vllm_engine import VllmGenerator
    from seal.runtime.generator_spec import local_generator_spec

    spec = local_generator_spec(compose([f"generator={generator}"]).generator, model_path="embedded")
    assert spec["_target_"] == "actors.generation.vllm_engine.VllmGenerator"
    accepted = set(inspect.signature(VllmGenerator.__init__).parameters)
    assert set(spec) - {"_target_"} <= accepted, set(spec) - {"_target_"} - accepted


@pytest.mark.parametrize("generator", ["vllm_cpu", "vllm_async_cpu", "vllm_gpu", "vllm_async_gpu"])
def test_every_generator_configs_engine_keywords_pass_the_engine_settings_checks(generator):
    """Both engines build one EngineSettings from their keywords (actors/generation/engine_settings.py),
    which refuses bad values; no shipped config may hold one (nothing starts here)."""
    import dataclasses

    from actors.generation.engine_settings import EngineSettings
    from seal.runtime.generator_spec import is_async_engine, split_generator_spec

    spec, _ = split_generator_spec(OmegaConf.to_container(compose([f"generator={generator}"]).generator, resolve=True))
    fields = {f.name for f in dataclasses.fields(EngineSettings)}
    settings = EngineSettings(
        **{k: v for k, v in spec.items() if k in fields},
        engine="async" if is_async_engine(spec["_target_"]) else "blocking",
    )
    assert settings.device == ("cuda" if generator.endswith("gpu") else "cpu")


@pytest.mark.parametrize("recipe", ["qwen3b_1x4", "qwen7b_1x8", "qwen7b_2x8", "qwen7b_lora_1x1"])
def test_gpu_recipes_recompute_every_micro_batch_as_their_plan_assumes(recipe):
    """seal/estimate/memory.py sizes a recipe's learner with recomputation on every micro-batch; the CPU
    default's 2048-token threshold (configs/learner/sizes/cpu.yaml: short shopping groups) must not reach them."""
    lc = compose([f"recipe={recipe}"]).learner.cfg
    assert lc.gradient_checkpointing is True and lc.gradient_checkpointing_min_tokens == 0


def _leaves(node, prefix: str = "") -> set[str]:
    if not isinstance(node, dict):
        return {prefix[:-1]}
    return {leaf for key, value in node.items() if key != "defaults" for leaf in _leaves(value, f"{prefix}{key}.")}


def test_the_learner_options_are_one_base_and_their_backend():
    """Every learner setting is written once, in configs/learner/base/learner.yaml; zero2, zero3
    and torch select it and say only their backend (so `lr` cannot drift between them)."""
    import yaml

    base = _leaves(yaml.safe_load((config_dir() / "learner" / "base" / "learner.yaml").read_text()))
    assert "cfg.lr" in base and "cfg.loss.kl_coef" in base
    for option in ("zero2", "zero3", "torch"):
        own = yaml.safe_load((config_dir() / "learner" / f"{option}.yaml").read_text())
        assert own["defaults"] == ["base/learner@_here_", "_self_"], option
        assert _leaves(own) == {"cfg.backend", "cfg.zero_stage"}, option
    composed = {o: compose([f"learner={o}"]).learner.cfg for o in ("zero2", "zero3", "torch")}
    assert [(c.backend, c.zero_stage) for c in composed.values()] == [("deepspeed", 2), ("deepspeed", 3), ("torch", 0)]
    assert (
        len(
            {
                OmegaConf.to_yaml(c).replace(f"zero_stage: {c.zero_stage}", "").replace(c.backend, "")
                for c in composed.values()
            }
        )
        == 1
    )


RECIPES = ("qwen3b_1x4", "qwen7b_1x8", "qwen7b_2x8")
# Recipes that train a LoRA adapter: their lr is LoRA's (~10x full training's), written in the recipe.
LORA_RECIPES = {"qwen7b_lora_1x1": 1.0e-5}


def test_lr_is_written_once_where_it_belongs_and_each_composition_ends_with_its_own():
    """The paper's lr in the learner base, the CPU default's in configs/learner/sizes/cpu.yaml (which
    the root config selects and the recipes leave out): no other file writes one to drift, but
    LoRA's own (its recipes, and the LoRA ablation arm: LoRA trains at about 10x full training's lr)."""
    import yaml

    writers = {
        str(p.relative_to(config_dir()))
        for p in config_dir().rglob("*.yaml")
        if any(leaf == "lr" or leaf.endswith(".lr") for leaf in _leaves(yaml.safe_load(p.read_text()) or {}))
    }
    assert writers == {"learner/base/learner.yaml", "learner/sizes/cpu.yaml", "ablation/lora.yaml"} | {
        f"recipe/{r}.yaml" for r in LORA_RECIPES
    }
    assert compose(["ablation=lora"]).learner.cfg.lr == 1.0e-4  # the main job's LoRA sweep's pick
    assert compose([]).learner.cfg.lr == 1.0e-5  # the CPU default
    for extra in ([], ["algo=seal_paper"], ["algo=seal_release"], ["ablation=vanilla_rl"]):
        assert compose(extra).learner.cfg.lr == 1.0e-5, extra
        for recipe in RECIPES:
            assert compose([f"recipe={recipe}", *extra]).learner.cfg.lr == 1.0e-6, (recipe, extra)
        for recipe, lr in LORA_RECIPES.items():
            assert compose([f"recipe={recipe}", *extra]).learner.cfg.lr == lr, (recipe, extra)


@pytest.mark.parametrize("recipe", [*RECIPES, *LORA_RECIPES])
def test_a_recipe_keeps_none_of_the_cpu_defaults_learner_sizes(recipe):
    """A recipe states only where it differs from the learner base: what it leaves unsaid is the
    base's (the paper's), never the CPU default's."""
    import yaml

    base = yaml.safe_load((config_dir() / "learner" / "base" / "learner.yaml").read_text())["cfg"]
    own = yaml.safe_load((config_dir() / "recipe" / f"{recipe}.yaml").read_text())["learner"]["cfg"]
    assert all(own[k] != base.get(k) for k in own), {k: own[k] for k in own if own[k] == base.get(k)}
    lc = compose([f"recipe={recipe}"]).learner.cfg
    for key in ("lr", "shared_prefix", "mini_batch_groups", "gradient_checkpointing_min_tokens"):
        assert lc[key] == (LORA_RECIPES[recipe] if key == "lr" and recipe in LORA_RECIPES else base[key]), key
