"""Generator and rollouts on real vLLM CPU with the tiny model (one engine per session)."""

from __future__ import annotations

import pytest

from env_pool.bfcl.env import BfclEnv
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.toy.env import ToyToolEnv
from rollout.chat import ChatTokenizer
from rollout.generator import GenerationRequest, SamplingConfig
from rollout.play import GroupStats, run_group

TRAIN = InterfaceState(version=3, schema_lite=True, error_feedback=True, guidelines=True, active_guidelines=("format",))


@pytest.fixture(scope="session")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


@pytest.fixture(scope="session")
def generator(tiny_path):
    from actors.generation.vllm_engine import VllmGenerator

    gen = VllmGenerator(tiny_path, max_model_len=8192, cpu_kv_cache_gb=1)
    yield gen
    gen.close()


@pytest.fixture(scope="session")
def chat(generator):
    return ChatTokenizer(generator.tokenizer)


@pytest.fixture(scope="session")
def bfcl_group(generator, chat):
    stats = GroupStats()
    group = run_group(
        lambda: BfclEnv(),
        generator,
        chat,
        "multi_turn_miss_func_0",
        4,
        SamplingConfig(max_new_tokens=24),
        TRAIN,
        seed=7,
        stats=stats,
    )
    return group, stats


def test_trajectory_invariants(bfcl_group, chat):
    group, _ = bfcl_group
    for traj in group:
        traj.validate()  # lengths, mask == generated segments, no logprobs on masked tokens
        assert traj.prompt_length > 0 and traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length
        assert traj.num_steps == len(traj.segments) and traj.num_generated_tokens > 0
        assert all(lp <= 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m)
        # Everything the env said (tool results, user turns) is masked: decoding
        # only the unmasked tokens gives exactly the assistant steps.
        generated = [chat.tokenizer.decode(traj.token_ids[s.start : s.end]) for s in traj.segments]
        for text in generated:
            assert "<|im_start|>user" not in text and "<|im_start|>tool" not in text
        assert len(traj.tags) == len(traj.labels) == 5 and traj.interface_version == 3


def test_group_shares_id_task_and_interface(bfcl_group):
    group, stats = bfcl_group
    assert len({(t.group_id, t.task_id, t.interface_version) for t in group}) == 1
    assert sorted(t.rollout_index for t in group) == [0, 1, 2, 3]
    assert stats.prefix_cache_hit_rate > 0.5  # the shared system prompt is computed once


def test_behaviour_logprobs_match_the_learner_model(bfcl_group, tiny_path):
    import torch
    from transformers import AutoModelForCausalLM

    from tests.integration.hf_logprobs import sequence_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    traj = min(bfcl_group[0], key=lambda t: len(t.token_ids))
    ours = sequence_logprobs(model, traj.token_ids)
    diffs = [abs(a - b) for a, b, m in zip(ours, traj.logprobs, traj.loss_mask) if m]
    assert diffs and max(diffs) < 1e-4, max(diffs)  # measured: 1e-6 (tiny), 2.5e-5 (embedded)


def test_weight_update_changes_output_and_version_and_restores_exactly(generator, chat, tiny_path, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    prompt = chat.prompt_ids([{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}])
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=12)
    request = [GenerationRequest("w", prompt, 12)]
    before = generator.generate(request, greedy)[0]
    start_version = generator.policy_version

    original = load_file(f"{tiny_path}/model.safetensors")
    torch.manual_seed(0)
    perturbed = {k: v + 0.05 * torch.randn_like(v) for k, v in original.items()}
    save_file(perturbed, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(open(f"{tiny_path}/config.json").read())
    seconds = generator.update_weights(start_version + 1, str(tmp_path))
    changed = generator.generate(request, greedy)[0]
    assert changed.policy_version == start_version + 1 and seconds < 5
    assert changed.token_ids != before.token_ids

    generator.update_weights(start_version + 2, dict(original))  # tensors in memory
    restored = generator.generate(request, greedy)[0]
    assert restored.token_ids == before.token_ids and restored.policy_version == start_version + 2
    assert restored.logprobs == pytest.approx(before.logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="older"):
        generator.update_weights(start_version, tiny_path)


def test_rollout_segments_carry_the_version_that_generated_them(generator, chat):
    version = generator.policy_version
    (traj,) = run_group(lambda: ToyToolEnv(), generator, chat, "toy_1", 1, SamplingConfig(max_new_tokens=8), seed=1)
    assert traj.policy_versions and set(traj.policy_versions) == {version} and traj.policy_version == version


def test_evaluation_prompt_is_the_raw_prompt(generator, chat):
    env = BfclEnv()
    raw = chat.prompt_ids(env.reset("multi_turn_base_3", RAW_INTERFACE))
    (traj,) = run_group(
        lambda: BfclEnv(),
        generator,
        chat,
        "multi_turn_base_3",
        1,
        SamplingConfig(temperature=0.0, max_new_tokens=4),
        RAW_INTERFACE,
    )
    assert traj.token_ids[: traj.prompt_length] == raw and traj.interface_version == 0
    trained = chat.prompt_ids(env.reset("multi_turn_base_3", TRAIN))
    assert trained != raw


def test_context_overflow_is_an_outcome_not_a_crash(generator, chat, monkeypatch):
    # BFCL prompts are several thousand tokens: a 2,048-token context cannot hold one.
    monkeypatch.setattr(generator, "max_model_len", 2048)
    group = run_group(lambda: BfclEnv(), generator, chat, "multi_turn_base_0", 2, SamplingConfig(max_new_tokens=8))
    assert [t.outcome for t in group] == ["context_overflow", "context_overflow"]
    assert all(
        t.reward == 0 and t.error_type == "multi_turn:force_terminated" and t.num_generated_tokens == 0 for t in group
    )
