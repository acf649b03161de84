"""Batches to the learner, and the end of each learner step.

A batch goes to the learner group as soon as the replay queue has one and the learner is idle;
the learner trains while generation goes on. Its end is a new policy version: published to the
generator replicas, the coordinator's round closed (sync mode waits for both). When the filter
keeps emptying the batch (``trainer.fill_patience`` batches' worth of equal-reward groups), the
step is skipped (no update, no new version) or trains on what is ready (``trainer.unfilled``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from replay.control_messages import TagSummary
from replay.messages import Trajectory
from seal.config import TrainerConfig
from seal.run.progress import learner_work
from seal.run.step_metrics import StepOutcome
from seal.runtime.calls import COORDINATOR_TIMEOUT_S, bounded_get

if TYPE_CHECKING:
    from replay.slots import SlotLedger
    from replay.transport import ReplayServer
    from seal.run.progress import Progress
    from seal.run.run_state import RunState
    from seal.run.step_metrics import StepWindow
    from seal.runtime.actor_set import ActorSet
    from seal.runtime.publisher import WeightPublisher

log = logging.getLogger(__name__)


class LearnerSteps:
    def __init__(
        self,
        trainer: TrainerConfig,
        state: RunState,
        actors: ActorSet,
        replay: ReplayServer,
        ledger: SlotLedger,
        publisher: WeightPublisher,
        window: StepWindow,
        progress: Progress,
        mini_batch_groups: int,
        old_logprobs: str,
    ) -> None:
        self.trainer, self.state, self.actors, self.replay, self.ledger = trainer, state, actors, replay, ledger
        self.publisher, self.window, self.progress = publisher, window, progress
        self.mini_batch_groups, self.old_logprobs = mini_batch_groups, old_logprobs
        self.call: tuple[Any, list, float] | None = None  # (the learner group's call, its groups, started)

    def refs(self) -> list:
        return list(self.call[0].refs) if self.call else []

    def advance(self) -> StepOutcome | None:
        """Start a step when a batch is ready; the step's outcome once it has ended (or was skipped)."""
        if self.call is None:
            skipped = self._maybe_train()
            if skipped is not None:
                return skipped
        return self._maybe_finish()

    def _record_tags(self, trajs: Sequence[Trajectory]) -> None:
        self.actors.coordinator.record.remote(
            [
                TagSummary(
                    task_id=t.task_id,
                    category=t.category,
                    tags=t.tags,
                    labels=t.labels,
                    reward=t.reward,
                    success=t.success,
                    progress=t.progress,
                    interface_version=t.interface_version,
                )
                for t in trajs
            ]
        )

    def _drain_filtered(self) -> None:
        """Zero-variance groups: their slots are done and their tags still shape the
        failure profile (the interface evolves from what the policy did, trained on or not)."""
        filtered = self.replay.drain_filtered()
        for g in filtered:
            self.ledger.filtered(g.group_id)
            self.window.decide("filtered", g)
        if filtered:
            self._record_tags([t for g in filtered for t in g.members])

    def _maybe_train(self) -> StepOutcome | None:
        """Hand a ready batch to the learner; the outcome of a step skipped for want of groups
        with reward variance, else None."""
        t = self.trainer
        groups = self.replay.take_batch()
        for g in self.replay.drain_dropped():
            slot = self.ledger.dropped(g.group_id)
            self.window.decide("stale_dropped", g)
            self.progress.group_dropped(g.group_id, slot, g.staleness, t.max_staleness)
        self._drain_filtered()
        partial = False
        if groups is None and self.window.filtered_count >= t.fill_patience * t.groups_per_step:
            # The filter keeps emptying the batch (a policy that always or never succeeds here).
            if t.unfilled == "partial":
                groups = self.replay.take_batch(partial=True)
                partial = groups is not None
            if groups is None:
                log.warning(
                    "step %d skipped: %d groups in a row had equal rewards (trainer.unfilled=%s)",
                    self.state.step + 1,
                    self.window.filtered_count,
                    t.unfilled,
                )
                return self._skip()
            log.warning(
                "step %d runs on %d of %d groups: %d had equal rewards (trainer.unfilled=partial)",
                self.state.step + 1,
                len(groups),
                t.groups_per_step,
                self.window.filtered_count,
            )
        if groups is None:
            return None
        trajs = [tr for g in groups for tr in g.trajectories]  # infra-faulted members' places hold stand-ins
        for g in groups:
            self.ledger.consumed(g.group_id)
            self.window.decide("trained", g)
        # Tags of what the learner trains on go to the coordinator first, then
        # its tag weights (an object ref: resolved by Ray, coordinator -> learner).
        self._record_tags([tr for g in groups for tr in g.members])
        weights_ref = self.actors.coordinator.step_weights.remote()
        group_weights = {g.group_id: g.weight for g in groups if g.weight < 1.0}
        ref = self.actors.learners.train(trajs, weights_ref, group_weights, self.state.version, partial)
        self.call = (ref, groups, time.perf_counter())
        work = learner_work(len(groups), len(trajs), self.mini_batch_groups, self.old_logprobs)
        self.progress.learner_train(self.state.step + 1, work)
        return None

    def _skip(self) -> StepOutcome:
        """A step without a learner update: no new policy version, nothing published; the
        coordinator still closes the round (the failure profile grew by the filtered groups)."""
        self.state.step += 1
        interface = bounded_get(
            self.actors.coordinator.end_round.remote(wait=self.trainer.sync),
            COORDINATOR_TIMEOUT_S,
            f"coordinator end_round of step {self.state.step} (skipped)",
        )
        return StepOutcome([], None, interface, 0.0)

    def _maybe_finish(self) -> StepOutcome | None:
        if self.call is None:
            return None
        ref, groups, started = self.call
        if not self.actors.learners.done(ref):
            return None
        result = self.actors.learners.result(ref)  # a learner failure ends the run (resume=RUN_DIR continues it)
        t_learn = time.perf_counter() - started
        self.call = None
        state = self.state
        state.version += 1
        state.step += 1
        self.replay.set_policy_version(state.version)
        self.progress.learner_phase(f"publish policy v{state.version} to the generator")
        refs = self.publisher.publish(state.version)
        round_ref = self.actors.coordinator.end_round.remote(wait=self.trainer.sync)
        if self.trainer.sync:  # generation waits for the new weights and interface; async goes on
            self.publisher.wait(refs)
        interface = bounded_get(round_ref, COORDINATOR_TIMEOUT_S, f"coordinator end_round of step {state.step}")
        state.count_tokens(result.sequence_tokens, 0)  # the rollout tokens: from the step's row (driver)
        return StepOutcome(groups, result, interface, t_learn)
