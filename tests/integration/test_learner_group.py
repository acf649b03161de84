"""The learner group on CPU: real Ray actors, real DeepSpeed ZeRO over gloo, the tiny model.
Two ranks equal one on the same batch; ZeRO-3 partitions policy and reference; weights, checkpoints
and a killed rank. One Ray session for the module."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import time

import numpy as np
import pytest
import torch

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from seal.cluster_config import ActorResources
from seal.config import LearnerGroupConfig
from seal.runtime.learner_group import LearnerGroup, LearnerGroupError
from tests.conftest import local_ray
from tests.integration.test_learner_engine import assert_same_update, make_batch, update_gap

N, GROUPS = 2, 3  # 3 groups over 2 ranks: one rank runs a padding micro-batch
TIMEOUT_S = 120.0


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    with local_ray(num_cpus=4, object_store_bytes=2**30):
        yield


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


@pytest.fixture(scope="module")
def batch(tiny_path):
    """3 groups of 2 whose sequences have different token counts (random span lengths)."""
    return make_batch(0, tiny_path) + make_batch(1, tiny_path)[:N]


BUCKET_MB = 0.1  # the tiny model's layers (0.28 MB fp32) in several buckets, its 12 MB embedding alone


def config(stage: int, kl_coef: float = 0.1, bucket_mb: float = BUCKET_MB) -> LearnerConfig:
    return LearnerConfig(
        backend="deepspeed",
        zero_stage=stage,
        lr=1.0,
        optimizer="sgd",
        weight_decay=0.0,
        mini_batch_groups=GROUPS,
        micro_batch_size=1,
        loss=LossConfig(kl_coef=kl_coef),
        weight_bucket_mb=bucket_mb,
    )


def group(tiny_path, cfg: LearnerConfig, world_size: int = 2, storage=None) -> LearnerGroup:
    make = functools.partial(
        Learner, tiny_path, cfg, group_size=N, world_size=world_size, timeout_s=TIMEOUT_S, step_timeout_s=3600.0
    )
    settings = settings_of(cfg, world_size, TIMEOUT_S, TIMEOUT_S)
    return LearnerGroup(make, settings, ActorResources(num_cpus=1, threads=1), storage=storage)


def settings_of(cfg: LearnerConfig, world_size: int, timeout_s: float, step_timeout_s: float) -> LearnerGroupConfig:
    """The learner group as configs/learner/ would give it, around ``cfg`` (a CPU learner: gloo)."""
    return LearnerGroupConfig(
        model_path="tiny",
        group_size=N,
        world_size=world_size,
        timeout_s=timeout_s,
        step_timeout_s=step_timeout_s,
        cfg=cfg,
    )


def manifest_weights(manifest) -> dict[str, torch.Tensor]:
    """The union of a manifest's buckets (each checked against the bucket size), as writable tensors."""
    import ray

    from weights.buckets import WeightManifest
    from weights.precision import from_wire_arrays

    assert isinstance(manifest, WeightManifest)
    limit = manifest.bucket_mb * 2**20
    out: dict[str, torch.Tensor] = {}
    for ref, nbytes in zip(manifest.buckets, manifest.bucket_nbytes):
        bucket = from_wire_arrays(
            {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in ray.get(ref, timeout=TIMEOUT_S).items()}
        )
        assert sum(t.numel() * t.element_size() for t in bucket.values()) == nbytes
        assert nbytes <= limit or len(bucket) == 1, (nbytes, list(bucket))  # over the size: a tensor alone
        assert not set(bucket) & set(out), "a tensor in two buckets"
        out.update(bucket)
    assert len(out) == manifest.num_params and sum(t.numel() for t in out.values()) == manifest.num_elements
    return out


@contextlib.contextmanager
def generator_end(g: LearnerGroup):
    """This process as the generator's end (rank 1) of a weight group that rank 0 of ``g`` forms:
    the receiver and the metadata of what each round sends."""
    import ray

    from weights.broadcast_group import WeightGroup, WeightMeta

    host, port = g.weight_group_address()
    meta_ref = g.join_weight_group(host, port, 2, "gloo")
    receiver = WeightGroup(host, port, 1, 2, "gloo", "cpu", TIMEOUT_S)
    try:
        yield receiver, [WeightMeta.from_wire(m) for m in ray.get(meta_ref, timeout=TIMEOUT_S)]
    finally:
        receiver.close()


def receive_round(receiver, meta) -> dict[str, torch.Tensor]:
    """One broadcast round on the generator's end of the weight group: every tensor the metadata names."""
    got = {}
    receiver.begin_round()  # "ready": rank 0 sends nothing before every receiver has said so
    for m in meta:
        got[m.name] = torch.empty(m.shape, dtype=m.torch_dtype)
        receiver.broadcast(got[m.name])
    return got


def group_weights(g: LearnerGroup) -> dict[str, torch.Tensor]:
    """The group's weights as the pipeline publishes them: through the object store, in buckets."""
    return manifest_weights(g.weights())


@pytest.fixture(scope="module")
def zero3_group(tiny_path):
    g = group(tiny_path, config(3))
    yield g
    g.close()


# ZeRO-2 starts a group of its own (about a minute here): slow; ZeRO-3 reuses the module's group.
@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_two_ranks_make_the_one_rank_update(tiny_path, batch, zero3_group, stage):
    # The one rank computes log p the straightforward way (the whole vocabulary's logits); the group's
    # ranks from the hidden states in chunks (the default): the same update, across ranks and paths.
    one = Learner(
        tiny_path,
        dataclasses.replace(config(stage), logprob_head="full"),
        group_size=N,
        world_size=1,
        timeout_s=600.0,
        step_timeout_s=3600.0,
    )
    before = one.weights_out.generator_weights()
    ref = one.train_batch(batch, RELEASED_BASE_WEIGHTS)
    after_one = one.weights_out.generator_weights()
    two = zero3_group if stage == 3 else group(tiny_path, config(2))
    try:
        # Same start, by the object store: the 2-rank group's buckets add up to the 1-rank learner's weights,
        # in the generator's dtype when it asks for one (bf16 as int16 bits in the store).
        manifest = two.weights()
        assert len(manifest.buckets) >= 3 and manifest.dtype == "float32"
        embedding = before["model.embed_tokens.weight"]  # 12 MB: over the bucket size, a bucket of its own
        assert max(manifest.bucket_nbytes) == embedding.numel() * embedding.element_size()
        start = manifest_weights(manifest)
        assert list(start) == list(before) and all(torch.equal(before[k], v) for k, v in start.items())
        half = manifest_weights(two.weights("bfloat16"))
        assert half.keys() == before.keys() and all(torch.equal(before[k].bfloat16(), v) for k, v in half.items())
        print(f"zero{stage} weights: {manifest.describe()}")
        del manifest
        got = two.train_now(batch, RELEASED_BASE_WEIGHTS)
        after_two = group_weights(two)
    finally:
        if two is not zero3_group:
            two.close()
    assert got.learner_world_size == 2 and got.groups == GROUPS
    assert got.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-7)
    assert got.grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
    assert got.scored_tokens == ref.scored_tokens and got.sequence_tokens == ref.sequence_tokens
    assert_same_update(before, after_one, after_two, f"zero{stage} 2 ranks vs 1")
    print(f"zero{stage}: worst update gap {max(update_gap(before, after_one, after_two).values()):.2e}")


@pytest.mark.slow  # two groups of their own: about two minutes here
@pytest.mark.parametrize("kl", [0.1, 0.0], ids=["kl", "no-kl"])
def test_two_zero3_ranks_packed_and_chunked_make_the_straightforward_update(tiny_path, kl):
    """2-rank ZeRO-3 with the fast path (rollouts packed, continuations side by side, chunked head)
    against one rank forwarding each trajectory alone with the whole vocabulary's logits."""
    shared = make_batch(4, tiny_path, shared_prompt=True) + make_batch(5, tiny_path, shared_prompt=True)[:N]
    old_cfg = dataclasses.replace(config(3, kl_coef=kl), logprob_head="full")
    one = Learner(tiny_path, old_cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    before = one.weights_out.generator_weights()
    ref = one.train_batch(shared, RELEASED_BASE_WEIGHTS)
    after_one = one.weights_out.generator_weights()
    new_cfg = dataclasses.replace(config(3, kl_coef=kl), micro_batch_size=N, shared_prefix=True)
    two = group(tiny_path, new_cfg)
    try:
        got = two.train_now(shared, RELEASED_BASE_WEIGHTS)
        after_two = group_weights(two)
    finally:
        two.close()
    assert got.forward_tokens < ref.forward_tokens  # packed: each group's prompt once
    assert got.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-7)
    assert got.grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
    assert_same_update(before, after_one, after_two, f"zero3 2 ranks packed + chunked vs 1 rank, kl {kl}")


def test_two_zero3_ranks_agree_on_recomputation_whatever_their_micro_batch_lengths(tiny_path, batch):
    """Issue 38 item 8: learner.cfg.gradient_checkpointing_min_tokens chose recomputation from each
    rank's own micro-batch. 3 groups over 2 ranks: where one rank forwards a ~25-token micro-batch
    the other forwards a 2-token pad, so under a bound of 3 one recomputed (ZeRO-3 gathers every
    layer again in the backward) and the other did not: the group died at step 1. The ranks now
    choose from the longest micro-batch at each place, and make the one-rank update."""
    cfg = dataclasses.replace(config(3), gradient_checkpointing=True, gradient_checkpointing_min_tokens=3)
    one = Learner(tiny_path, cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    before = one.weights_out.generator_weights()
    one.train_batch(batch, RELEASED_BASE_WEIGHTS)
    after_one = one.weights_out.generator_weights()
    two = group(tiny_path, cfg)
    try:
        got = two.train_now(batch, RELEASED_BASE_WEIGHTS)
        after_two = group_weights(two)
        two.train_now(batch, RELEASED_BASE_WEIGHTS)  # and again, from the updated weights
    finally:
        two.close()
    assert got.learner_world_size == 2 and two.step == 2
    assert_same_update(before, after_one, after_two, "zero3 2 ranks recomputing by length vs 1")


def test_zero3_ranks_each_hold_half_of_policy_and_reference(zero3_group):
    shares = zero3_group.param_shares()
    total = shares[0]["total"]
    assert shares[0]["ref_total"] == total
    for s in shares:
        assert abs(s["held"] / total - 0.5) < 0.02, s
        assert abs(s["ref_held"] / total - 0.5) < 0.02, s
    print("zero3 params per rank:", [(s["held"], s["ref_held"]) for s in shares], "of", total)


def test_broadcast_from_two_ranks_sends_the_gathered_weights_bucket_by_bucket(zero3_group):
    """This process is the generator's end of the weight group (rank 1); the 2-rank ZeRO-3 group
    gathers 0.1 MB buckets (the tiny model: several) and rank 0 sends them."""
    with generator_end(zero3_group) as (receiver, meta):
        zero3_group.broadcast_weights()
        got = receive_round(receiver, meta)
    expected = group_weights(zero3_group)  # the object-store path (equal to the 1-rank learner's above)
    assert list(got) == list(expected) and all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_broadcast_not_waited_for_runs_before_the_next_checkpoint_and_step_on_every_rank(
    tiny_path, batch, zero3_group, tmp_path
):
    """The pipeline starts the broadcast and goes on; the next checkpoint and step are issued while
    it still runs (here: the receiver is slow). Each rank must finish the broadcast's ZeRO-3 gathers
    before the checkpoint's and the step's collectives start: the receiver gets exactly the weights
    from before the step (not torn by the optimizer), and nothing aborts or hangs. Before tickets
    (learner/call_order.py) the calls ran at once on a rank's two threads: gloo aborted
    (``Pair::prepareRead``) or the group hung."""
    import threading

    before = group_weights(zero3_group)
    got: dict[str, torch.Tensor] = {}
    second: dict[str, torch.Tensor] = {}
    with generator_end(zero3_group) as (receiver, meta):

        def receive() -> None:
            time.sleep(3.0)  # a slow replica: the driver's next calls are issued meanwhile
            for into in (got, second):  # two rounds: before the step and after it
                into.update(receive_round(receiver, meta))

        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        zero3_group.broadcast_weights()  # not waited for, as in the pipeline
        zero3_group.save_checkpoint(str(tmp_path / "ckpt"), {"step": zero3_group.step})
        result = zero3_group.train_now(batch, RELEASED_BASE_WEIGHTS)
        zero3_group.broadcast_weights()
        zero3_group.wait_pending()
        thread.join(TIMEOUT_S)
        assert not thread.is_alive()
    assert list(got) == list(before) and all(torch.equal(got[k], before[k]) for k in before)
    after = group_weights(zero3_group)
    assert result.learner_world_size == 2 and result.groups == GROUPS
    assert any(not torch.equal(after[k], before[k]) for k in before)  # the step did change them
    assert all(torch.equal(second[k], after[k]) for k in after)
    shards = [p.name for p in (tmp_path / "ckpt").rglob("*optim_states*")]
    assert len(shards) == 2, shards


def _join_then_exit(host: str, port: int, world_size: int) -> None:
    """A replica's worker that joins the weight group and then its process ends (a crash)."""
    from weights.broadcast_group import WeightGroup

    WeightGroup(host, port, 1, world_size, "gloo", "cpu", TIMEOUT_S)
    os._exit(0)


@pytest.mark.slow  # about a minute on 2 cores (CI, 2026-12-06); its silent-receiver sibling is slow too
def test_a_weight_round_a_replica_leaves_fails_alone_and_the_group_trains_on(tiny_path, batch, zero3_group):
    """A replica dying mid-round fails the broadcast on rank 0 (WeightGroupError) while rank 1 finishes
    its gathers: the learner group is whole, so the run goes on (the fleet restores the replica and
    the group is formed again) instead of stopping with "learner rank 0 failed during weight broadcast"."""
    import multiprocessing as mp

    import ray

    host, port = zero3_group.weight_group_address()
    meta_ref = zero3_group.join_weight_group(host, port, 2, "gloo")
    proc = mp.get_context("spawn").Process(target=_join_then_exit, args=(host, port, 2), daemon=True)
    proc.start()
    ray.get(meta_ref, timeout=TIMEOUT_S)  # rank 0 formed the group with it
    proc.join(60)  # it joined, took nothing and is gone
    zero3_group.broadcast_weights()
    zero3_group.wait_pending()  # ends: the round failed on rank 0 alone
    assert len(zero3_group.survivable_failures) == 1
    assert zero3_group.survivable_failures[0].startswith("learner rank 0 on node ")
    assert "weight broadcast at step" in zero3_group.survivable_failures[0]
    got = zero3_group.train_now(batch, RELEASED_BASE_WEIGHTS)  # the group is whole
    assert got.learner_world_size == 2
    # Formed again (a restored replica), the next round arrives whole.
    with generator_end(zero3_group) as (receiver, meta):
        zero3_group.broadcast_weights()
        received = receive_round(receiver, meta)
        zero3_group.wait_pending()
    expected = group_weights(zero3_group)
    assert all(torch.equal(received[k], expected[k]) for k in expected)
    assert len(zero3_group.survivable_failures) == 1


@pytest.mark.slow  # a group of its own, with a short collective timeout: about two minutes here
def test_a_round_whose_receiver_stays_silent_fails_alone_before_the_gathers_time_out(tiny_path, batch):
    """Issue 38 item 1: a replica that joined the weight group and never receives (alive, silent).
    Rank 0 used to wait for its first tensor as long as the training group's timeout while rank 1
    waited in a ZeRO-3 gather under that same timeout: rank 1's gather timed out first and the
    learner died. Now rank 0 waits for the receivers' "ready" at most half of it, then walks the
    gathers without sending: the round fails alone (counted) and the next step trains."""
    import ray

    from weights.broadcast_group import WeightGroup

    short = 45.0  # the training group's collectives and rank 0's weight group alike (learner.timeout_s)
    make = functools.partial(
        Learner, tiny_path, config(3), group_size=N, world_size=2, timeout_s=short, step_timeout_s=3600.0
    )
    g = LearnerGroup(make, settings_of(config(3), 2, short, TIMEOUT_S), ActorResources(num_cpus=1, threads=1))
    silent = None
    try:
        host, port = g.weight_group_address()
        meta_ref = g.join_weight_group(host, port, 2, "gloo")
        silent = WeightGroup(host, port, 1, 2, "gloo", "cpu", short)  # joins, then never receives
        ray.get(meta_ref, timeout=TIMEOUT_S)
        g.broadcast_weights()
        g.wait_pending()  # today: LearnerGroupError, rank 1's gather timed out
        assert len(g.survivable_failures) == 1, g.survivable_failures
        assert "never said they were ready" in g.survivable_failures[0]
        assert g.train_now(batch, RELEASED_BASE_WEIGHTS).learner_world_size == 2
    finally:
        if silent is not None:
            silent.close()
        g.close()


def test_no_reference_without_kl(tiny_path):
    g = group(tiny_path, config(3, kl_coef=0.0), world_size=1)
    try:
        assert g.param_shares()[0]["ref_total"] == 0
    finally:
        g.close()


def test_checkpoint_resume_with_two_ranks_is_exact_and_pruned(tiny_path, batch, zero3_group, tmp_path):
    from tests.integration.test_learner_engine import make_batch as more

    path = str(tmp_path / "ckpt")
    later = more(5, tiny_path) + more(6, tiny_path)[:N]
    for _ in range(3):
        zero3_group.save_checkpoint(path, {"step": zero3_group.step}, keep=2)
    tags = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step"))
    assert len(tags) == 1  # the same step saved three times: one tag
    zero3_group.train_now(batch, RELEASED_BASE_WEIGHTS)
    zero3_group.save_checkpoint(path, {"step": zero3_group.step}, keep=2)
    zero3_group.train_now(batch, RELEASED_BASE_WEIGHTS)
    zero3_group.save_checkpoint(path, {"mark": "resume here"}, keep=2)
    tags = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step"))
    assert len(tags) == 2, tags
    shards = sorted(p.name for p in (tmp_path / "ckpt" / tags[-1]).iterdir() if "optim_states" in p.name)
    assert len(shards) == 2, shards  # one ZeRO shard per rank
    zero3_group.train_now(later, RELEASED_BASE_WEIGHTS)
    expected = group_weights(zero3_group)
    resumed = group(tiny_path, config(3), storage=str(tmp_path))
    try:
        assert resumed.load_checkpoint(path) == {"mark": "resume here"}
        resumed.train_now(later, RELEASED_BASE_WEIGHTS)
        got = group_weights(resumed)
    finally:
        resumed.close()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_killed_rank_is_named_within_the_timeout_and_nothing_hangs(tiny_path, batch):
    g = group(tiny_path, config(3))
    pids = g.pids()
    # Soon after the call: on a quiet machine the whole step can end within a second, and a kill
    # after it has finished proves nothing (the test then "did not raise").
    call = g.train(batch * 1, RELEASED_BASE_WEIGHTS)
    time.sleep(0.2)  # mid-step
    assert not g.done(call), "the step ended before the kill: make the batch larger"
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(LearnerGroupError, match=r"learner rank 1 on node .* died during train step at step 1"):
        while not g.done(call):
            time.sleep(0.2)
    assert time.monotonic() - t0 < TIMEOUT_S
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not any(_alive(p) for p in pids), "a learner rank outlived the failure"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie awaiting its parent's wait() is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_start_past_the_timeout_names_the_rank_and_step_not_a_bare_key_error():
    """A blocking call whose wait runs out raises the named timeout (it once fell through and
    surfaced as ``KeyError: 0`` from the missing result)."""
    settings = settings_of(LearnerConfig(mini_batch_groups=1), 1, timeout_s=3.0, step_timeout_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(
        LearnerGroupError,
        match=r"learner start at step 0 did not finish in time: learner rank 0 on node \S+ .* had not answered",
    ):
        # A learner factory that outlives the timeout (a stuck model load, a rendezvous that never forms).
        LearnerGroup(functools.partial(time.sleep, 600), settings, ActorResources(num_cpus=1, threads=1))
    assert time.monotonic() - t0 < 60
