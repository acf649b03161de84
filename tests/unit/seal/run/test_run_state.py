"""RunState (seal/run/run_state.py) with a fake learner group at its edge (it keeps the driver's part
of a checkpoint and writes a placeholder for published weights) and the real coordinator service as a
Ray actor: a checkpoint's driver state resumes the run where it stood (step, policy version, cumulative
cost, the coordinator's state and the slots as given), and snapshots are indexed in order, A_0 on the
base model and later ones on the weights the learner published, relative to the run directory when
they live inside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from actors.coordinator.coordinator import Coordinator, CoordinatorState
from actors.coordinator.tag_weights import TagWeights
from env_pool.interface.state import InterfaceState
from replay.control_messages import TagSummary
from replay.slots import SlotPosition
from seal.run.progress import Progress
from seal.run.run_state import DriverState, RunState
from seal.run.snapshots import read_snapshots
from tests.conftest import local_ray

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def coordinator():
    import ray

    from actors.coordinator.service import CoordinatorService

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=2, object_store_bytes=80 * 2**20):
        service = ray.remote(CoordinatorService).remote(make_coordinator)
        summary = TagSummary(
            task_id="t0",
            category="base",
            tags=["empty_turn_model_response"],
            labels=["missing_tool_call"],
            reward=0.0,
            success=False,
            progress=0.0,
            interface_version=0,
        )
        ray.get(service.record.remote([summary] * 8), timeout=60)
        ray.get(service.end_round.remote(), timeout=60)  # interface v1: a state worth carrying
        yield service


def make_coordinator() -> Coordinator:
    return Coordinator(InterfaceState(schema_lite=True, guidelines=True), TagWeights())


class FakeLearnerGroup:
    """Keeps what a checkpoint holds for the driver; a snapshot is a placeholder weights file."""

    def __init__(self) -> None:
        self.snapshots: list[tuple[str, int]] = []

    def save_checkpoint(self, path: str, extra, keep: int = 0) -> str:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "driver.json").write_text(json.dumps(extra))
        return path

    def load_checkpoint(self, path: str) -> dict:
        return json.loads((Path(path) / "driver.json").read_text())

    def save_snapshot(self, out_dir: str, version: int) -> tuple[str, float]:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "model.safetensors").write_bytes(b"")
        self.snapshots.append((out_dir, version))
        return out_dir, 0.0


class Actors:
    def __init__(self, coordinator) -> None:
        self.coordinator, self.learners = coordinator, FakeLearnerGroup()


def state(run_dir: Path, storage: Path, actors: Actors, resumed=None) -> RunState:
    return RunState(run_dir, storage, actors, Progress(quiet=True), "tiny", checkpoint_keep=2, resumed=resumed)


def test_a_checkpoint_resumes_the_run_where_it_stood(tmp_path, coordinator):
    import ray

    actors = Actors(coordinator)
    run = state(tmp_path, tmp_path, actors)
    assert (run.step, run.version) == (0, 0)
    run.step, run.version = 3, 2
    run.count_tokens(update=100, rollout=400)
    path = run.checkpoint(SlotPosition(7, (9,), 0))
    assert path == tmp_path / "checkpoints" / "latest"

    resumed = DriverState.from_dict(actors.learners.load_checkpoint(str(path)))  # through JSON, as learner.json
    assert resumed.coordinator == ray.get(coordinator.state.remote(), timeout=60)
    assert resumed.slots == SlotPosition(7, (9,), 0)
    again = state(tmp_path, tmp_path, actors, resumed)
    assert (again.step, again.version) == (3, 2)
    again.count_tokens(update=1, rollout=2)
    assert (again.totals["update_tokens"], again.totals["rollout_tokens"]) == (101, 402)
    assert again.totals["wall_s"] == resumed.totals["wall_s"] > 0  # wall time carries across the resume


def test_the_driver_state_crosses_json_typed_and_an_older_slot_position_still_reads():
    state = DriverState(
        3, 2, CoordinatorState({"version": 1}, {}, {}, {}, 4), SlotPosition(7, (9, 11), 1), {"wall_s": 1.0}
    )
    assert DriverState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    older = {**state.to_dict(), "slots": {"low": 7, "done": [9]}}  # before the given-up count was kept
    assert DriverState.from_dict(older).slots == SlotPosition(7, (9,), 0)


def test_a_checkpoint_without_driver_state_is_one_line():
    with pytest.raises(ValueError, match="holds no driver state coordinator, slots: was it written by seal train"):
        DriverState.from_dict({"step": 1, "policy_version": 1})


def test_snapshots_are_indexed_in_order_on_the_weights_they_stand_for(tmp_path, coordinator):
    actors = Actors(coordinator)
    run = state(tmp_path, tmp_path, actors)
    assert run.needs_base_snapshot()
    run.snapshot(initial=True)
    assert not run.needs_base_snapshot() and actors.learners.snapshots == []
    run.step, run.version = 4, 3
    run.count_tokens(update=10, rollout=20)
    run.snapshot(metrics={"reward": 0.5})

    a0, a1 = read_snapshots(tmp_path)
    assert (a0["name"], a0["step"], a0["weights"]) == ("A_0", 0, "tiny")  # the base model, by name
    assert (a1["name"], a1["step"], a1["policy_version"], a1["weights"]) == ("A_1", 4, 3, "snapshots/A_1")
    assert a1["interface_version"] == 1 and (a1["update_tokens"], a1["rollout_tokens"]) == (10, 20)
    assert actors.learners.snapshots == [(str(tmp_path / "snapshots" / "A_1"), 3)]
    assert (tmp_path / "snapshots" / "A_1" / "tokenizer.json").is_file()  # vLLM loads the directory alone
    assert json.loads((tmp_path / "snapshots" / "A_1" / "metrics.json").read_text()) == {"reward": 0.5}


def test_snapshot_weights_on_a_storage_of_their_own_are_recorded_by_absolute_path(tmp_path, coordinator):
    run_dir, storage = tmp_path / "run", tmp_path / "shared" / "run"
    run = state(run_dir, storage, Actors(coordinator))
    run.snapshot(initial=True)
    run.snapshot()
    assert read_snapshots(run_dir)[1]["weights"] == str(storage / "snapshots" / "A_1")
