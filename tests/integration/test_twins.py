"""The tiny twins (weights/twins.py): each builds deterministically with its family's real tokenizer,
keeps the real model's structure, runs in transformers, and vLLM's CPU build loads it by name and
generates greedily with the logprobs transformers gives the same tokens.

The HF checks are seconds per twin and run by default; a vLLM engine per twin is 10 to 50 s on two
cores, so only qwen3-twin's runs by default and the others are marked slow. The MoE twins are kept
(they build, run and generate) but are no training targets: weights/twins.py says why."""

from __future__ import annotations

import json

import pytest

from weights.twins import TWIN_NAMES, TWINS, build_twin, max_model_len, twin_dir

CHEAP = "qwen3-twin"
TEXT = "  Book a table for two at 7pm,  near   the station.\nThen: tell me the total?  "

# What makes each architecture itself, as the loaded HF model shows it: a parameter that must exist,
# a tied head or not, and config values the real model has.
STRUCTURE = {
    "qwen2.5-7b-twin": ("model.layers.0.self_attn.q_proj.bias", False, {"vocab_size": 152064}),
    "qwen2.5-3b-twin": ("model.layers.0.self_attn.k_proj.bias", True, {"vocab_size": 151936}),
    "qwen3-twin": ("model.layers.0.self_attn.q_norm.weight", False, {"max_position_embeddings": 40960}),
    "llama3.1-twin": ("model.layers.0.mlp.gate_proj.weight", False, {"max_position_embeddings": 131072}),
    "gemma3-twin": (
        "model.layers.1.post_feedforward_layernorm.weight",
        True,
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512, "query_pre_attn_scalar": 256},
    ),
    "deepseek-v3-twin": (
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
        False,
        {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "first_k_dense_replace": 1},
    ),
    "gpt-oss-twin": ("model.layers.0.self_attn.sinks", False, {"sliding_window": 128}),
}


def slow_but(cheap: str, names) -> list:
    return [pytest.param(n, marks=() if n == cheap else pytest.mark.slow) for n in names]


def test_every_twin_is_a_training_target_or_says_why_not():
    from seal.config import config_dir
    from weights.model_assets import resolve_model
    from weights.twins import check_runnable

    assert set(STRUCTURE) == set(TWINS) and CHEAP in TWIN_NAMES
    assert set(TWINS) - set(TWIN_NAMES) == {"deepseek-v3-twin", "gpt-oss-twin"}  # vLLM CPU's MoE updates
    for name, twin in TWINS.items():
        assert (name in TWIN_NAMES) == (twin.unsupported is None)
        assert (config_dir() / "model" / f"{name}.yaml").is_file()  # composes; refused when loaded by name
        if twin.unsupported:
            for refuse in (check_runnable, resolve_model):
                with pytest.raises(ValueError, match=f"^{name} is not a training target: [^\n]+$"):
                    refuse(name)


def test_resolve_model_takes_twin_names():
    from weights.model_assets import resolve_model

    assert resolve_model(CHEAP) == build_twin(CHEAP)
    with pytest.raises(FileNotFoundError, match="no config.json.*a tiny twin"):
        resolve_model("no-such-twin")


@pytest.mark.parametrize("name", list(TWINS))
def test_twin_builds_deterministically_with_the_real_structure(name, tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    cached = build_twin(name)
    assert cached == twin_dir(name)
    # Again from nothing, in another cache (the tokenizers shared: they are checked in their own test).
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tokenizers").symlink_to(cached.parent.parent / "tokenizers")
    monkeypatch.setenv("SEAL_CACHE", str(tmp_path / "cache"))
    digest = TWINS[name].digest()
    again = build_twin(name)
    assert TWINS[name].digest() == digest  # building leaves the spec as it was (its marker stays valid)
    assert again != cached and again.parent.parent == tmp_path / "cache"
    first, second = load_file(cached / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (cached / f).read_bytes() == (again / f).read_bytes(), f

    twin = TWINS[name]
    config = json.loads((cached / "config.json").read_text())
    generation = json.loads((cached / "generation_config.json").read_text())
    assert generation["eos_token_id"] == twin.generation["eos_token_id"]
    assert config["architectures"] == twin.real["architectures"] and config["hidden_size"] == 64
    assert config["num_hidden_layers"] == 2 and config["tie_word_embeddings"] == twin.real["tie_word_embeddings"]
    param, tied, fields = STRUCTURE[name]
    assert {k: config[k] for k in fields} == fields
    assert max_model_len(name) == min(8192, config["max_position_embeddings"])

    model = AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32).eval()
    names = dict(model.named_parameters(remove_duplicate=False))
    assert param in names
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == tied
    if name == "llama3.1-twin":
        rope = model.config.rope_parameters
        assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("llama3", 8.0, 8192)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 17, 300, 4000, 9]])).logits
    assert logits.shape == (1, 5, config["vocab_size"]) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", list(TWINS))
def test_twin_tokenizer_round_trips_text_and_knows_the_end_ids(name):
    from transformers import AutoTokenizer

    path = build_twin(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT  # spaces kept (a Metaspace-broken tokenizer drops them)
    ends = TWINS[name].generation["eos_token_id"]
    ends = ends if isinstance(ends, list) else [ends]
    assert tokenizer.eos_token_id in ends
    for token in tokenizer.convert_ids_to_tokens(ends):
        assert token in tokenizer.all_special_tokens or token in tokenizer.get_added_vocab(), token
    if TWINS[name].tokenizer != "gptoss":  # gpt-oss conversations are harmony: no HF template
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi there"}], tokenize=False)
        assert "hi there" in rendered


@pytest.mark.parametrize("name", slow_but(CHEAP, TWINS))
def test_vllm_cpu_serves_the_twin_as_transformers_scores_it(name):
    """Every twin, the MoE ones too (they load and generate; only their weight updates fail:
    tests/integration/test_twin_weight_sync.py); a training target by its name (the hook)."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from actors.generation.vllm_engine import VllmGenerator
    from rollout.generator import GenerationRequest, SamplingConfig
    from tests.integration.hf_logprobs import sequence_logprobs

    path = build_twin(name)
    t0 = time.perf_counter()
    model = name if name in TWIN_NAMES else str(path)  # a name that is no training target is refused
    generator = VllmGenerator(model, max_model_len=max_model_len(name), cpu_kv_cache_gb=1)
    try:
        assert generator.model_path == str(path)
        print(f"{name}: vLLM engine up in {time.perf_counter() - t0:.1f} s")
        prompt = generator.tokenizer.encode(TEXT, add_special_tokens=False)
        greedy = SamplingConfig(temperature=0.0, max_new_tokens=12)
        out = generator.generate([GenerationRequest("g", prompt, 12)], greedy)[0]
        assert len(out.token_ids) == 12 and out.finish_reason == "length"
        assert generator.generate([GenerationRequest("g", prompt, 12)], greedy)[0].token_ids == out.token_ids
    finally:
        generator.close()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = sequence_logprobs(model, prompt + out.token_ids)[len(prompt) :]
    diff = max(abs(a - b) for a, b in zip(ours, out.logprobs))
    print(f"{name}: max |vLLM - HF| logprob over 12 greedy tokens {diff:.2e}")
    assert diff < 1e-4, diff


@pytest.mark.parametrize("name", list(TWINS))
def test_each_twin_has_its_model_config_and_plan_spec(name):
    from seal.config import compose, config_dir

    cfg = compose([f"model={name}"])
    assert (cfg.model.path, cfg.model.max_model_len, cfg.model.spec) == (name, max_model_len(name), name)
    spec = json.loads((config_dir() / "model_specs" / name / "config.json").read_text())
    built = json.loads((build_twin(name) / "config.json").read_text())
    spec.pop("_comment"), built.pop("transformers_version", None)
    assert spec == built  # `seal plan` reads what the twin is
