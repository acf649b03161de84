"""Snapshots (``save_snapshot``): written tensor by tensor as save_pretrained lays them out, loadable by
transformers; from a 2-rank ZeRO-3 group, gathered a bucket at a time on every rank with host copies
on rank 0 only (issue 26, finding 8), and equal to what one rank writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from learner.safetensors_out import SAFE_WEIGHTS_INDEX_NAME, ShardedWriter, TensorSpec

TIMEOUT_S = 120.0
BUCKET_MB = 0.1  # the tiny model's layers (0.28 MB fp32) in several buckets, its 12 MB embedding alone


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            assert f.metadata() == {"format": "pt"}  # transformers refuses a file without it
            for k in f.keys():
                assert k not in out, f"{k} in two files"
                out[k] = f.get_tensor(k)
    return out


def test_the_writer_writes_what_the_safetensors_library_writes(tmp_path):
    tensors = {
        "a.weight": torch.randn(3, 5),
        "b.half": torch.randn(7).bfloat16(),
        "c.scalar": torch.tensor(2.5),
        "d.mask": torch.tensor([True, False, True]),
        "e.empty": torch.zeros(0, 4),
        "f.t": torch.randn(4, 6).t(),
    }
    specs = [TensorSpec.of(k, v.shape, v.dtype) for k, v in tensors.items()]
    mine = tmp_path / "mine"
    mine.mkdir()
    writer = ShardedWriter(mine, specs, max_shard_bytes=10**9)
    for k, v in tensors.items():
        writer.write(k, v)
    writer.close()
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "lib.safetensors"), metadata={"format": "pt"}
    )
    got, want = read_safetensors(mine), read_safetensors(tmp_path)
    assert [p.name for p in mine.iterdir()] == ["model.safetensors"]
    assert got.keys() == want.keys() == tensors.keys()
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in tensors)
    # Sharded: 60-byte files, the index names each tensor's file.
    shards = tmp_path / "shards"
    shards.mkdir()
    writer = ShardedWriter(shards, specs, max_shard_bytes=60)
    for k, v in tensors.items():
        writer.write(k, v)
    writer.close()
    index = json.loads((shards / SAFE_WEIGHTS_INDEX_NAME).read_text())
    files = sorted(p.name for p in shards.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert set(index["weight_map"]) == set(tensors) and set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == sum(s.nbytes for s in specs)
    assert all(torch.equal(v, tensors[k]) for k, v in read_safetensors(shards).items())
    # Out of order, or a tensor short: refused, never a file with a hole.
    bad = ShardedWriter(tmp_path, specs[:2], max_shard_bytes=10**9)
    with pytest.raises(ValueError, match="expected"):
        bad.write("b.half", tensors["b.half"])
    with pytest.raises(ValueError, match="never written"):
        bad.close()


def learner_cfg(stage: int, backend: str = "deepspeed") -> LearnerConfig:
    return LearnerConfig(
        backend=backend,
        zero_stage=stage,
        optimizer="sgd",
        mini_batch_groups=1,
        micro_batch_size=1,
        loss=LossConfig(kl_coef=0.0),
        weight_bucket_mb=BUCKET_MB,
    )


def assert_same_snapshot(got: Path, want: Path) -> None:
    """The same files, configs and tensors (seal-version.json aside, which names the version)."""
    names = {p.name for p in got.iterdir()}
    assert names == {p.name for p in want.iterdir()}
    for name in names - {"seal-version.json"}:
        if name.endswith(".json"):
            assert json.loads((got / name).read_text()) == json.loads((want / name).read_text()), name
    a, b = read_safetensors(got), read_safetensors(want)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_snapshot_is_what_save_pretrained_writes_and_loads(tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM

    lrn = Learner(
        tiny_path, learner_cfg(0, "torch"), group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0
    )
    path, _ = lrn.weights_out.save_snapshot(tmp_path / "weights", version=3, step=lrn.step)
    assert path.name == "v000003" and json.loads((path / "seal-version.json").read_text()) == {"version": 3, "step": 0}
    reference = tmp_path / "save_pretrained"
    lrn.model.save_pretrained(reference, safe_serialization=True)
    (reference / "seal-version.json").write_text("{}")
    assert_same_snapshot(path, reference)
    assert lrn.weights_out.last_stats.host_bytes == sum(p.numel() * 4 for p in lrn.model.parameters())
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    mine = lrn.weights_out.full_state_dict()
    assert loaded.keys() == mine.keys() and all(torch.equal(loaded[k], mine[k]) for k in loaded)
    # Shards and their index, as save_pretrained writes a model over its shard size; transformers loads them.
    lrn.weights_out.snapshot_shard_bytes = 2 * 2**20
    sharded, _ = lrn.weights_out.save_snapshot(tmp_path / "weights", version=4, step=lrn.step)
    assert (sharded / SAFE_WEIGHTS_INDEX_NAME).is_file() and len(list(sharded.glob("model-*-of-*.safetensors"))) > 1
    again = AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32).state_dict()
    assert all(torch.equal(again[k], mine[k]) for k in mine)


def test_two_zero3_ranks_save_the_one_rank_snapshot_with_host_copies_on_rank_0_only(tiny_path, tmp_path):
    import ray

    from tests.conftest import local_ray
    from tests.integration.test_learner_group import group

    one = Learner(
        tiny_path, learner_cfg(0, "torch"), group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0
    )
    want, _ = one.weights_out.save_snapshot(tmp_path / "one", version=1, step=one.step)
    total = sum(p.numel() * 4 for p in one.model.parameters())
    largest = max(p.numel() * 4 for p in one.model.parameters())  # the embedding: a bucket of its own
    with local_ray(num_cpus=4, object_store_bytes=2**30):
        g = group(tiny_path, learner_cfg(3), world_size=2)
        try:
            got, _ = g.save_snapshot(str(tmp_path / "two"), 1)
            # Each rank's own account of what it took (learner/weights_out.py WeightsOutStats).
            stats = ray.get(
                [a.__ray_call__.remote(lambda rank: rank.learner.weights_out.last_stats) for a in g.actors],
                timeout=TIMEOUT_S,
            )
        finally:
            g.close()
    assert_same_snapshot(Path(got), want)
    print("weights out per rank:", stats, "of", total, "bytes")
    assert stats[0].host_bytes == total  # rank 0 copies every tensor once, to write it
    assert stats[1].host_bytes == 0  # rank 1 only joins the gathers
    for s in stats:  # no rank held more than one bucket (or the one tensor over the size) gathered
        assert 0 < s.largest_gather_bytes <= max(BUCKET_MB * 2**20, largest) < total
