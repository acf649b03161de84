"""An in-process learner leaves the process group it formed: closing the last learner on it destroys
it, so the process can form another (issue 38 item 5: under `pytest -m gpu` a DeepSpeed learner's
group outlived it and a later NCCL test's init_process_group raised "initialize the default process
group twice"). Run in a fresh process: what other tests left in this one cannot change the answer."""

from __future__ import annotations

import socket

import torch.multiprocessing as mp


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _learners_then_a_group(path: str, port: int, out) -> None:
    try:
        import dataclasses

        import torch.distributed as dist

        from env_pool.tags import RELEASED_BASE_WEIGHTS
        from learner.engine import Learner, LearnerConfig
        from learner.loss import LossConfig
        from tests.integration.test_learner_engine import make_batch

        batches = [make_batch(seed, path) for seed in (0, 1)]  # before a ZeRO-3 learner partitions from_pretrained
        # ZeRO-3 with a KL term: the reference is a DeepSpeed engine too.
        zero3 = LearnerConfig(
            backend="deepspeed", zero_stage=3, mini_batch_groups=2, micro_batch_size=1, loss=LossConfig(kl_coef=0.1)
        )
        first = Learner(path, zero3, group_size=2, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
        first.train_batch(batches[0], RELEASED_BASE_WEIGHTS)
        first.close()
        first.close()  # twice: nothing more
        gone = not dist.is_initialized()
        # What the NCCL test does next in `pytest -m gpu`: a default group of its own.
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        dist.destroy_process_group()
        # Two learners alive at once share the group the first formed (ZeRO-2: DeepSpeed's ZeRO-3
        # hooks serve one model per process); the group goes with the last.
        zero2 = dataclasses.replace(zero3, zero_stage=2)
        second, third = (
            Learner(path, zero2, group_size=2, world_size=1, timeout_s=600.0, step_timeout_s=3600.0),
            Learner(path, zero2, group_size=2, world_size=1, timeout_s=600.0, step_timeout_s=3600.0),
        )
        second.close()
        shared_kept = dist.is_initialized()
        third.train_batch(batches[1], RELEASED_BASE_WEIGHTS)
        third.close()
        out.put(("ok", gone, shared_kept, dist.is_initialized()))
    except BaseException as exc:  # the parent reports it
        out.put(("error", f"{type(exc).__name__}: {exc}", None, None))


def test_closing_the_last_in_process_learner_frees_the_default_group_for_the_next():
    from weights.model_assets import prepare_tiny_model

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_learners_then_a_group, args=(str(prepare_tiny_model()), _port(), out))
    proc.start()
    try:
        status, gone, shared_kept, left = out.get(timeout=600)
    finally:
        proc.join(60)
    assert status == "ok", gone
    assert gone, "the learner's close left the default process group behind"
    assert shared_kept, "closing one learner destroyed the group another learner still used"
    assert not left and proc.exitcode == 0
