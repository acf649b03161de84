"""The coordinator as a service: the Coordinator (capability state, tag-weight
EMA, interface evolution) plus the pushes to the actors that use its output.

Runs as a Ray actor. Tag summaries come in with ``record``; ``step_weights``
returns the tag weights for the next learner step (the orchestrator passes
the returned object straight into the learner's call, so the weights go
coordinator -> learner without a round trip); ``end_round`` evolves the
interface and pushes the new version to every registered env actor. Pushes
are fire-and-forget unless the caller asks to wait (sync mode), so the
coordinator never holds up generation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from actors.coordinator.coordinator import Coordinator, CoordinatorState
from replay.control_messages import InterfaceStateMessage, InterfaceUpdate, RoundEnd, TagSummary

log = logging.getLogger(__name__)


class CoordinatorService:
    def __init__(self, make_coordinator: Callable[[], Coordinator], state: CoordinatorState | None = None) -> None:
        self.coordinator = make_coordinator()
        if state is not None:
            self.coordinator.load_state(state)
        self.env_actors: dict[str, Any] = {}
        self.recorded = 0

    def register_env_actor(self, name: str, handle: Any) -> None:
        self.env_actors[name] = handle

    def unregister_env_actor(self, name: str) -> None:
        self.env_actors.pop(name, None)

    def record(self, summaries: Sequence[TagSummary]) -> int:
        for s in summaries:
            self.coordinator.record(s)
        self.recorded += len(summaries)
        return self.recorded

    def interface(self) -> InterfaceUpdate:
        state = self.coordinator.interface
        return InterfaceUpdate(state.version, InterfaceStateMessage.from_dict(state.to_dict()))

    def step_weights(self) -> dict[str, float]:
        return self.coordinator.step_weights()

    def end_round(self, wait: bool = False, timeout_s: float = 60.0) -> RoundEnd:
        """Omega_{t+1} = Evolve(Omega_t, C_t), pushed to the env actors."""
        import ray

        before = self.coordinator.interface.version
        state = self.coordinator.end_round()
        pushed = 0
        if state.version != before:
            update = InterfaceUpdate(state.version, InterfaceStateMessage.from_dict(state.to_dict()))
            refs = [h.set_interface.remote(update) for h in self.env_actors.values()]
            pushed = len(refs)
            if wait and refs:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
                for ref in ready:
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayActorError:  # a dead actor reads the interface when it restarts
                        log.warning("an env actor died before taking interface v%d", state.version)
        message = InterfaceStateMessage.from_dict(state.to_dict())
        return RoundEnd(state.version, tuple(state.active_guidelines), pushed, message)

    def end_epoch(self) -> None:
        self.coordinator.end_epoch()

    def state(self) -> CoordinatorState:
        return self.coordinator.state()
