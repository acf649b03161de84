"""LoRA under 2-rank ZeRO-3 on CPU (real Ray actors, DeepSpeed over gloo, the tiny model): the base and
the adapter both partitioned, two steps equal to one rank's, the adapter out through the object store
and the broadcast group, the merged snapshot, and a checkpoint that resumes exactly. One Ray session
and one 2-rank group for the module: about a minute here (2.7 under load), so slow; ZeRO-2 LoRA's
cheaper tests (test_learner_lora.py) stay in the default suite."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.lora import LoraConfig
from tests.integration.test_learner_engine import assert_same_update, make_batch
from tests.integration.test_learner_group import (
    GROUPS,
    TIMEOUT_S,
    N,
    config,
    generator_end,
    group,
    manifest_weights,
    ray_session,  # noqa: F401  (the module's Ray session: an autouse fixture)
    receive_round,
    tiny_path,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.slow

RANK = 8


@pytest.fixture(scope="module")
def batches(tiny_path):
    """Two steps' batches of 3 groups of 2 (3 groups over 2 ranks: one rank runs a padding micro-batch)."""
    return [make_batch(s, tiny_path) + make_batch(s + 1, tiny_path)[:N] for s in (0, 2)]


def lora_config(stage: int) -> LearnerConfig:
    """The learner group test's config (SGD at lr 1: the update is the clipped gradient, compared across
    ranks with its tolerance; the KL term on, so the reference, the base with the adapter off, runs
    under ZeRO-3 too), in fp32, with a rank-8 adapter."""
    return dataclasses.replace(config(stage), dtype="float32", lora=LoraConfig(rank=RANK, alpha=16))


@pytest.fixture(scope="module")
def one_rank(tiny_path, batches):
    """One ZeRO-3 rank in this process: its adapter after each step (gathered, as a publish reads it)
    and its merged weights."""
    one = Learner(tiny_path, lora_config(3), group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    adapters, results = [manifest_weights(one.weights_out.weight_manifest())], []
    for batch in batches:
        results.append(one.train_batch(batch, RELEASED_BASE_WEIGHTS))
        adapters.append(manifest_weights(one.weights_out.weight_manifest()))
    return {"adapters": adapters, "results": results, "merged": one.weights_out.generator_weights()}


@pytest.fixture(scope="module")
def zero3_lora(tiny_path, batches):
    """The 2-rank ZeRO-3 group, its adapter before and after each of the two steps, their results."""
    g = group(tiny_path, lora_config(3))
    try:
        shares = g.param_shares()
        adapters, results = [manifest_weights(g.weights())], []  # the adapter alone, gathered from both ranks
        for batch in batches:
            results.append(g.train_now(batch, RELEASED_BASE_WEIGHTS))
            adapters.append(manifest_weights(g.weights()))
        yield {"group": g, "shares": shares, "adapters": adapters, "results": results}
    finally:
        g.close()


def test_two_zero3_ranks_partition_base_and_adapter_and_make_the_one_rank_update(zero3_lora, one_rank):
    total = zero3_lora["shares"][0]["total"]
    assert all(s["held"] < 0.6 * total for s in zero3_lora["shares"]), zero3_lora["shares"]  # each about half
    start = zero3_lora["adapters"][0]
    assert start.keys() == one_rank["adapters"][0].keys() and all("lora_" in k for k in start)
    assert all(torch.equal(start[k], v) for k, v in one_rank["adapters"][0].items()), "same seed, same A"
    for step, (got, ref) in enumerate(zip(zero3_lora["results"], one_rank["results"])):
        assert got.learner_world_size == 2 and got.groups == GROUPS
        assert got.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-7)
        assert got.grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
        before, after = one_rank["adapters"][step], one_rank["adapters"][step + 1]
        assert_same_update(before, after, zero3_lora["adapters"][step + 1], f"LoRA zero3 step {step + 1}")
    # Step 1 moves B alone (B starts at 0, so A has no gradient); step 2 moves A as well.
    moved = {k for k in start if not torch.equal(start[k], zero3_lora["adapters"][2][k])}
    assert any(".lora_A." in k for k in moved) and any(".lora_B." in k for k in moved)


def test_the_adapter_leaves_a_zero3_group_through_the_broadcast_group_as_through_the_store(zero3_lora):
    g = zero3_lora["group"]
    with generator_end(g) as (receiver, meta):
        assert [m.name for m in meta] == list(manifest_weights(g.weights()))
        g.broadcast_weights()
        got = receive_round(receiver, meta)
        g.wait_pending()
    expected = manifest_weights(g.weights())
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_zero3_lora_snapshot_is_the_merged_model_transformers_loads(zero3_lora, one_rank, tmp_path):
    from transformers import AutoModelForCausalLM

    g = zero3_lora["group"]
    path, _ = g.save_snapshot(str(tmp_path), version=2)
    assert json.loads((tmp_path / "v000002" / "seal-version.json").read_text())["version"] == 2
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    merged = one_rank["merged"]  # the one rank's base + adapter after the same two steps
    assert not any("lora_" in k for k in loaded)
    worst = max(float((loaded[k] - v).abs().max()) for k, v in merged.items())
    assert worst < 1e-5, f"merged weights differ from the one rank's by {worst}"


def test_a_zero3_lora_checkpoint_resumes_the_adapter_and_its_optimizer_exactly(zero3_lora, batches, tmp_path):
    g = zero3_lora["group"]
    ckpt = str(tmp_path / "ckpt")
    g.save_checkpoint(ckpt, {"step": 2})
    saved = manifest_weights(g.weights())
    first = g.train_now(batches[0], RELEASED_BASE_WEIGHTS)
    after_first = manifest_weights(g.weights())
    g.load_checkpoint(ckpt)
    back = manifest_weights(g.weights())
    assert all(torch.equal(back[k], v) for k, v in saved.items()), "the checkpoint's adapter"
    again = g.train_now(batches[0], RELEASED_BASE_WEIGHTS)
    assert again.loss == first.loss and again.grad_norm == first.grad_norm
    redone = manifest_weights(g.weights())
    assert all(torch.equal(redone[k], v) for k, v in after_first.items()), "the step after a resume"
    g.load_checkpoint(ckpt)  # back where the other tests expect the group
    print(
        f"zero3 LoRA: {len(saved)} adapter tensors, {sum(t.numel() for t in saved.values())} parameters, "
        f"timeout {TIMEOUT_S} s; one-rank config {dataclasses.asdict(lora_config(3))['lora']}"
    )
