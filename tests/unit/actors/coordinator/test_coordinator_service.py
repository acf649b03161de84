"""The coordinator service without Ray: tags in, weights and interface out."""

from __future__ import annotations

from actors.coordinator.coordinator import Coordinator
from actors.coordinator.service import CoordinatorService
from actors.coordinator.tag_weights import TagWeights
from env_pool.interface.state import InterfaceState
from replay.control_messages import TagSummary


def make() -> Coordinator:
    return Coordinator(InterfaceState(schema_lite=True, error_feedback=True, guidelines=True), TagWeights())


def summaries(k: int) -> list[TagSummary]:
    return [
        TagSummary(
            task_id=f"t{i}",
            category="base",
            tags=["empty_turn_model_response"],
            labels=["missing_tool_call"],
            reward=0.0,
            success=False,
            progress=0.0,
            interface_version=0,
        )
        for i in range(k)
    ]


def test_round_trip_of_tags_weights_and_interface():
    service = CoordinatorService(make)
    assert service.record(summaries(8)) == 8
    weights = service.step_weights()
    assert weights["empty_turn_model_response"] > 1.0
    out = service.end_round()  # no env actors registered: nothing pushed
    assert (out.interface_version, out.active_guidelines, out.pushed_to) == (1, ("active_respond",), 0)
    assert service.interface().version == 1 and service.interface().state.active_guidelines == ("active_respond",)


def test_state_survives_a_restart_through_its_state():
    service = CoordinatorService(make)
    service.record(summaries(8))
    service.step_weights()
    service.end_round()
    restored = CoordinatorService(make, state=service.state())
    assert restored.state() == service.state()
    assert restored.interface() == service.interface()
