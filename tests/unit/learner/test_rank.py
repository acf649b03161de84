"""LearnerRank (learner/rank.py), the rank actor's class, called directly with fakes only at its edges:
a learner that records what it is asked (the real one needs a model) and this node's address (Ray's)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import learner.rank as rank_module
from learner.call_order import CallOrderError
from learner.rank import LearnerRank
from learner.rank_shards import RankShard, Rendezvous
from tests.unit.learner.step_results import step_result


class FakeWeightsOut:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def weight_manifest(self, dtype: str | None) -> str:
        self.calls.append(f"weights {dtype}")
        return "manifest"

    def save_snapshot(self, out_dir: str, version: int, step: int) -> tuple[str, float]:
        self.calls.append(f"snapshot v{version} at step {step}")
        return f"{out_dir}/v{version}", 0.5


class FakeLearner:
    """What LearnerRank calls on its Learner; each call is logged in the order it ran."""

    def __init__(self, world_size: int = 1, body_s: float = 0.0) -> None:
        self.world_size, self.body_s, self.step, self.timeout_s = world_size, body_s, 7, 30.0
        self.calls: list[str] = []
        self.threads: list[str] = []  # the thread each call ran on
        self.weights_out = FakeWeightsOut(self.calls)
        self.model = torch.nn.Linear(3, 2)  # 8 parameters, all held (no ZeRO-3 partition)
        self.ref = None

    def train_batch(self, trajectories: list, tag_weights: Any, group_weights: Any, **kw: Any) -> Any:
        time.sleep(self.body_s)  # long enough that an unordered rank would let the next call in
        self.threads.append(threading.current_thread().name)
        self.calls.append(f"train v{kw['policy_version']} minis {kw['mini_groups']}")
        return step_result(loss=0.25)

    def canary_logprobs(self, token_ids: list[int]) -> list[float]:
        self.calls.append(f"canary {token_ids}")
        self.threads.append(threading.current_thread().name)
        return [-0.5] * (len(token_ids) - 1)

    def save_checkpoint(self, path: str, extra: Any, keep: int) -> str:
        self.calls.append(f"checkpoint {path} keep {keep}")
        self.threads.append(threading.current_thread().name)
        return path

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        self.calls.append(f"resume {path}")
        return {"step": self.step}


@pytest.fixture(autouse=True)
def this_node(monkeypatch):
    monkeypatch.setattr(rank_module, "_node_ip", lambda: "10.0.0.5")  # Ray's view of this node


def rendezvous(rank: int = 0, world_size: int = 1, wait_s: float = 10.0) -> Rendezvous:
    return Rendezvous("10.0.0.5", 29500, rank, world_size, "gloo", timeout_s=30.0, wait_s=wait_s)


def started(learner: FakeLearner, wait_s: float = 10.0) -> LearnerRank:
    r = LearnerRank()
    assert r.start(0, rendezvous(wait_s=wait_s), lambda: learner) == 0
    return r


def test_start_builds_the_learner_and_names_the_rank_in_its_errors():
    learner = FakeLearner()
    r = started(learner)
    assert r.learner is learner and r.rank == 0 and r.wait_s == 10.0
    assert r.order.name == "learner rank 0 on node 10.0.0.5" and r.next_ticket() == 1


def test_a_learner_built_for_another_world_size_is_refused():
    with pytest.raises(ValueError, match="configured for world_size=2, the group has 1"):
        LearnerRank().start(0, rendezvous(), lambda: FakeLearner(world_size=2))


def test_an_ordered_call_before_start_says_so():
    with pytest.raises(RuntimeError, match="called before start built its learner"):
        LearnerRank().canary_logprobs(0, [1, 2])


def test_calls_run_in_ticket_order_whatever_order_they_arrive_in():
    learner = FakeLearner(body_s=0.05)
    r = started(learner)
    results: dict[str, Any] = {}
    shard = RankShard(trajectories=[], mini_groups=[["g1"]])
    # Ticket 2 (the canary) arrives first; it must wait for ticket 1 (the step) to finish.
    late = threading.Thread(target=lambda: results.update(canary=r.canary_logprobs(2, [5, 6, 7])))
    late.start()
    time.sleep(0.05)
    assert learner.calls == []  # still waiting for its turn
    results["step"] = r.train_shard(1, shard, {"tool_misuse": 2.0}, None, policy_version=3)
    late.join(timeout=10)
    assert learner.calls == ["train v3 minis [['g1']]", "canary [5, 6, 7]"]
    assert results["canary"] == [-0.5, -0.5]
    # The step's result says which tag weights it trained with (a copy: the caller's dict may change).
    assert results["step"].loss == 0.25 and results["step"].tag_weights == {"tool_misuse": 2.0}


def test_weights_snapshots_and_checkpoints_reach_the_learner_in_order():
    learner = FakeLearner()
    r = started(learner)
    assert r.weights(1, "bfloat16") == "manifest"
    assert r.save_snapshot(2, "/runs/x/snapshots", 4) == ("/runs/x/snapshots/v4", 0.5)
    assert r.save_checkpoint(3, "/runs/x/ck", {"version": 4}, keep=2) == "/runs/x/ck"
    assert r.load_checkpoint(4, "/runs/x/ck") == {"step": 7}
    assert learner.calls == [
        "weights bfloat16",
        "snapshot v4 at step 7",
        "checkpoint /runs/x/ck keep 2",
        "resume /runs/x/ck",
    ]


def test_a_call_whose_predecessor_never_comes_fails_after_the_step_timeout():
    r = started(FakeLearner(), wait_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(
        CallOrderError, match=r"learner rank 0 on node 10.0.0.5: weight canary \(ticket 2\) waited 0.2s"
    ):
        r.canary_logprobs(2, [1, 2])  # ticket 1 was never sent
    assert time.monotonic() - t0 < 5


def test_rank_0_cannot_broadcast_before_the_weight_group_is_formed():
    r = started(FakeLearner())
    with pytest.raises(RuntimeError, match="broadcast_weights before join_weight_group"):
        r.broadcast_weights(1)


def test_the_parameter_share_of_an_unpartitioned_model_is_all_of_it():
    learner = FakeLearner()
    r = started(learner)
    assert r.param_share(1) == {"held": 8, "total": 8, "ref_held": 0, "ref_total": 0}
    learner.ref = SimpleNamespace(module=torch.nn.Linear(2, 2))  # a DeepSpeed-wrapped reference: its module
    assert r.param_share(2) == {"held": 8, "total": 8, "ref_held": 6, "ref_total": 6}


def test_every_ordered_call_runs_on_the_one_torch_thread_whichever_thread_brings_it():
    # Ray serves a rank's calls on a pool of threads; torch's per-thread caches (learner/torch_thread.py)
    # must see one thread, the one the learner was built on.
    built_on: list[str] = []
    learner = FakeLearner()
    r = LearnerRank()
    r.start(0, rendezvous(), lambda: built_on.append(threading.current_thread().name) or learner)
    shard = RankShard(trajectories=[], mini_groups=[["g1"]])
    callers = [
        threading.Thread(target=r.train_shard, args=(1, shard, {}, None, 1)),
        threading.Thread(target=r.canary_logprobs, args=(2, [1, 2])),
        threading.Thread(target=r.save_checkpoint, args=(3, "/runs/x/ck", {}, 1)),
    ]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=10)
    assert len(learner.calls) == 3
    assert set(learner.threads) == set(built_on) == {"learner-torch"}


def test_a_failing_body_on_the_torch_thread_fails_its_call_and_passes_the_turn():
    class Broken(FakeLearner):
        def canary_logprobs(self, token_ids: list[int]) -> list[float]:
            raise ValueError("no such token")

    r = started(Broken())
    with pytest.raises(ValueError, match="no such token"):
        r.canary_logprobs(1, [1])
    assert r.save_checkpoint(2, "/runs/x/ck", {}, 1) == "/runs/x/ck"
