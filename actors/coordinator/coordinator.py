"""The coordinator: owns the capability state, evolves the training interface
and the A-Patch tag weights from it (docs/design.md).

A plain object; the orchestrator decides where it runs (in process, or as a
Ray actor in the asynchronous pipeline) and feeds it tag summaries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from actors.coordinator.capability_state import CapabilityState
from actors.coordinator.tag_weights import TagWeights
from env_pool.interface.guidelines import GuidelinePolicy, evolve
from env_pool.interface.state import InterfaceState
from replay.control_messages import TagSummary


@dataclass(frozen=True)
class CoordinatorState:
    """What the coordinator carries across a resume (the checkpoint's driver state keeps it as JSON)
    and a snapshot records: each part as its own class writes it."""

    interface: dict[str, Any]  # InterfaceState.to_dict()
    tag_weights: dict[str, Any]  # TagWeights.to_dict()
    capability: dict[str, Any]  # CapabilityState.to_dict(): the failure profile
    weight_stats: dict[str, Any]  # CapabilityState.to_dict() of the tag-weight statistics
    rounds: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CoordinatorState:
        return cls(
            interface=dict(d["interface"]),
            tag_weights=dict(d["tag_weights"]),
            capability=dict(d["capability"]),
            weight_stats=dict(d["weight_stats"]),
            rounds=int(d["rounds"]),
        )


class Coordinator:
    def __init__(
        self,
        interface: InterfaceState,
        tag_weights: TagWeights,
        closed_loop: bool = True,
        per_category_guidelines: bool = False,
        vocabulary: str = "released",
        guideline_policy: GuidelinePolicy = GuidelinePolicy(),
    ) -> None:
        if vocabulary not in ("released", "paper"):
            raise ValueError(f"vocabulary must be released or paper, got {vocabulary!r}")
        self.interface = interface
        self.tag_weights = tag_weights
        self.closed_loop = closed_loop  # False: the profile is frozen after the first round
        self.per_category = per_category_guidelines
        self.vocabulary = vocabulary
        self.policy = guideline_policy
        self.capability = CapabilityState()  # guidelines read the released tags
        self.weight_stats = CapabilityState()  # tags of the vocabulary that drives A-Patch
        self.rounds = 0

    def record(self, s: TagSummary) -> None:
        self.capability.record(s.category, s.task_id, s.tags, s.reward, s.success, s.progress)
        self.weight_stats.record(
            s.category,
            s.task_id,
            s.tags if self.vocabulary == "released" else s.labels,
            s.reward,
            s.success,
            s.progress,
        )

    def step_weights(self) -> dict[str, float]:
        """One EMA step of the tag weights (once per learner step)."""
        return self.tag_weights.update(self.weight_stats.tag_counts("tag"))

    def end_round(self) -> InterfaceState:
        """Omega_{t+1} = Evolve(Omega_t, C_t); frozen after round 1 without the closed loop."""
        self.rounds += 1
        if self.closed_loop or self.rounds == 1:
            categories = None
            if self.per_category:
                names = self.capability.tag_counts("category")
                categories = {c: self.capability.tag_counts("category_tag", prefix=f"{c}::") for c in names}
            self.interface = evolve(self.interface, self.capability.tag_counts("tag"), categories, self.policy)
        return self.interface

    def end_epoch(self) -> None:
        self.capability.end_epoch()
        self.weight_stats.end_epoch()

    def state(self) -> CoordinatorState:
        return CoordinatorState(
            interface=self.interface.to_dict(),
            tag_weights=self.tag_weights.to_dict(),
            capability=self.capability.to_dict(),
            weight_stats=self.weight_stats.to_dict(),
            rounds=self.rounds,
        )

    def load_state(self, state: CoordinatorState) -> None:
        self.interface = InterfaceState.from_dict(state.interface)
        self.tag_weights.load(state.tag_weights)
        self.capability = CapabilityState.from_dict(state.capability)
        self.weight_stats = CapabilityState.from_dict(state.weight_stats)
        self.rounds = state.rounds
