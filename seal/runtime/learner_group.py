"""The learner group on the driver side: N LearnerRank actors (learner/rank.py) in one placement
group, one torch.distributed group among them, every call made on all ranks at once and waited
for with a timeout. A rank that dies or a call that overruns stops the run with one error naming
the rank, its node and the step; the group's actors are killed then, so none is left waiting in
a collective.

PACK places the ranks on as few nodes as fit them (NCCL within a node) and spans nodes otherwise.

Calls that touch the model or a process group carry a ticket per rank, numbered in the order this
driver issues them; each rank runs them in that order, one at a time (learner/call_order.py). So
a broadcast started without waiting (the generator loads while the next batch is played) and the
next step or checkpoint never run their collectives at once, and every rank runs the same
sequence; the driver itself never blocks on the broadcast.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learner.rank import LearnerRank
from learner.rank_shards import Rendezvous, shard_batch
from learner.step_result import LearnerStepResult, merge_results
from seal.cluster_config import ActorResources
from seal.config import LearnerGroupConfig
from seal.estimate.io_bounds import IoBounds
from seal.runtime.storage import StorageError, check_nodes_see
from weights.buckets import WeightManifest

log = logging.getLogger(__name__)


class LearnerGroupError(RuntimeError):
    """A rank failed or a call overran its timeout (the message names rank, node and step)."""


@dataclass
class GroupCall:
    """Calls in flight on every rank (one ref per rank, rank order)."""

    refs: list
    what: str
    step: int
    deadline: float
    results: dict[int, Any] = field(default_factory=dict)
    # Errors that fail the call on a rank but leave the group whole (the rank finished its part of
    # every collective): kept as that rank's result instead of stopping the run.
    survivable: tuple[type, ...] = ()


class LearnerGroup:
    def __init__(
        self,
        make_learner: Callable[[], Any],
        settings: LearnerGroupConfig,
        resources: ActorResources,
        io: IoBounds | None = None,
        storage: str | Path | None = None,
        env_vars: Mapping[str, str] | None = None,
        placement: Any = None,
    ) -> None:
        """``settings``: the ``learner`` group, typed (seal/config.py); ``io``: how long a checkpoint,
        a resume and a snapshot may take on every rank (seal/estimate/io_bounds.py; None: the model's
        size is not known here, so ``timeout_s`` as every other call); ``placement``: a placement
        group already reserved for the ranks, one bundle per rank, which the group then owns
        (seal/runtime/layout_guard.py reserve_learner: the plan's layout); None: PACK here."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.settings, self.io, self.step = settings, io, 0
        self.actors: list = []
        self.nodes: list[dict[str, Any]] = [{"ip": "?", "host": "?"}] * settings.world_size
        self._pending: list[GroupCall] = []  # calls not waited for (broadcast), checked at the next call
        self._tickets = [0] * settings.world_size  # the next ticket per rank (learner/call_order.py)
        self._weight_join_ticket = 0  # rank 0's ticket of the latest weight-group join (wait_weight_group_turn)
        self.survivable_failures: list[str] = []  # e.g. a weight round a receiver left (``broadcast_weights``)
        bundle = {k: v for k, v in resources.bundle().items() if v}
        self.pg = (
            placement
            if placement is not None
            else (placement_group([bundle] * settings.world_size, strategy="PACK") if bundle else None)
        )
        try:
            if self.pg is not None and not self.pg.wait(settings.timeout_s):
                raise LearnerGroupError(
                    f"the cluster cannot place {settings.world_size} learner ranks of {bundle} "
                    f"within {settings.timeout_s:g}s (learner.world_size, cluster.learner)"
                )
            threads = resources.thread_count() or None
            for r in range(settings.world_size):
                # Threads: an ordered call running, the next one waiting for its turn, and probes (pid, node).
                opts: dict[str, Any] = dict(
                    max_restarts=0,
                    max_concurrency=4,
                    runtime_env={"env_vars": dict(env_vars or {})},
                    **resources.ray_options(),
                )
                if self.pg is not None:
                    opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=r
                    )
                self.actors.append(ray.remote(LearnerRank).options(**opts).remote(threads))
            self.nodes = self._probe_all(lambda a: a.node.remote(), "start")
            host, port = self._get_one(self.actors[0].address.remote(), 0, "start")
            factory = resources.pinned(make_learner)
            self._all(
                "start",
                "start",
                lambda r: (
                    Rendezvous(
                        host,
                        port,
                        r,
                        settings.world_size,
                        settings.process_group_backend,
                        settings.timeout_s,
                        self.wait_s,
                    ),
                    factory,
                ),
            )
            if storage is not None:
                self.check_storage(Path(storage))
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- bounds
    @property
    def checkpoint_timeout_s(self) -> float | None:
        """A checkpoint or resume on every rank: its bytes at the slowest storage assumed (None: timeout_s)."""
        return self.io.checkpoint_s if self.io is not None else None

    @property
    def snapshot_timeout_s(self) -> float | None:
        return self.io.snapshot_s if self.io is not None else None

    @property
    def wait_s(self) -> float:
        """How long a rank's call may wait for the one before it (learner/call_order.py): the longest
        call the driver allows, a step or a checkpoint."""
        return max(self.settings.step_timeout_s, self.checkpoint_timeout_s or 0.0, self.snapshot_timeout_s or 0.0)

    # ---------------------------------------------------------------- calls
    def _name(self, rank: int) -> str:
        node = self.nodes[rank]
        return f"learner rank {rank} on node {node['ip']} ({node['host']})"

    def _fail(self, message: str) -> None:
        self.close()  # the other ranks would wait in a collective until its timeout
        raise LearnerGroupError(message)

    def _ticket(self, rank: int) -> int:
        ticket, self._tickets[rank] = self._tickets[rank], self._tickets[rank] + 1
        return ticket

    def _submit(self, rank: int, method: str, *args):
        """An ordered call on one rank: ``method(ticket, *args)``."""
        return getattr(self.actors[rank], method).remote(self._ticket(rank), *args)

    def _start(
        self,
        method: str,
        what: str,
        args=lambda rank: (),
        timeout_s: float | None = None,
        survivable: tuple[type, ...] = (),
    ) -> GroupCall:
        """``method`` on every rank, in order (a ticket each); ``args(rank)``: that rank's arguments."""
        refs = [self._submit(r, method, *args(r)) for r in range(len(self.actors))]
        return GroupCall(
            refs, what, self.step, time.monotonic() + (timeout_s or self.settings.timeout_s), survivable=survivable
        )

    def _collect(self, call: GroupCall, block: bool) -> bool:
        """Results of finished ranks into ``call.results``; True when every rank has answered."""
        import ray

        while len(call.results) < len(call.refs):
            waiting = [ref for r, ref in enumerate(call.refs) if r not in call.results]
            left = call.deadline - time.monotonic()
            ready, _ = ray.wait(waiting, num_returns=1, timeout=max(0.0, left) if block else 0)
            if not ready:
                if block or time.monotonic() >= call.deadline:  # a blocking wait that returns empty has timed out
                    ranks = [r for r in range(len(call.refs)) if r not in call.results]
                    self._fail(
                        f"learner {call.what} at step {call.step} did not finish in time: "
                        + ", ".join(self._name(r) for r in ranks)
                        + " had not answered"
                    )
                return False
            for ref in ready:
                rank = call.refs.index(ref)
                try:
                    call.results[rank] = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    raised = getattr(exc, "cause", None)  # the rank's own exception (RayTaskError)
                    if call.survivable and isinstance(raised, call.survivable):
                        call.results[rank] = raised
                        continue
                    rank, death = self._first_death(call, rank, exc)
                    cause = (getattr(death, "error_msg", None) or str(death)).strip().splitlines()
                    died = isinstance(death, ray.exceptions.RayActorError)
                    self._fail(
                        f"{self._name(rank)} {'died' if died else 'failed'} during {call.what} at step {call.step}: "
                        f"{cause[-1] if cause else death.__class__.__name__}"
                    )
        return True

    def _first_death(self, call: GroupCall, rank: int, exc: Exception, grace_s: float = 15.0) -> tuple[int, Exception]:
        """The rank to blame: when one rank dies its peers' collectives fail at once (connection reset),
        often before Ray has noticed the death; a dead rank found within ``grace_s`` is the cause."""
        import ray

        if isinstance(exc, ray.exceptions.RayActorError):
            return rank, exc
        # The peers' own calls, and a ping each (actors serve two calls at once): a dead one raises.
        probes = {ref: r for r, ref in enumerate(call.refs) if r != rank and r not in call.results}
        probes.update({a.pid.remote(): r for r, a in enumerate(self.actors) if r != rank})
        deadline = time.monotonic() + grace_s
        while probes and time.monotonic() < deadline:
            ready, _ = ray.wait(list(probes), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                r = probes.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as death:
                    return r, death
                except ray.exceptions.RayError:
                    pass
        return rank, exc

    def _all(self, method: str, what: str, args=lambda rank: (), timeout_s: float | None = None) -> list:
        """An ordered call on every rank, waited for (a call not waited for before it is checked
        first; the ranks run it after that one anyway)."""
        self._check_pending()
        call = self._start(method, what, args, timeout_s)
        self._collect(call, block=True)
        return [call.results[r] for r in range(len(self.actors))]

    def _probe_all(self, fn, what: str) -> list:
        """A call that touches neither model nor group (no ticket: it answers while a step runs)."""
        call = GroupCall([fn(a) for a in self.actors], what, self.step, time.monotonic() + self.settings.timeout_s)
        self._collect(call, block=True)
        return [call.results[r] for r in range(len(self.actors))]

    def _get_one(self, ref, rank: int, what: str):
        call = GroupCall([ref], what, self.step, time.monotonic() + self.settings.timeout_s)
        self._collect(call, block=True)
        return call.results[0]

    def _check_pending(self) -> None:
        for call in list(self._pending):
            if self._collect(call, block=False):
                self._finished(call)

    def _finished(self, call: GroupCall) -> None:
        """A call not waited for has ended on every rank: note a survivable failure (the weight
        round that a replica left: the fleet restores the replica and the group is formed again)."""
        self._pending.remove(call)
        for rank, result in sorted(call.results.items()):
            if isinstance(result, BaseException):
                message = f"{self._name(rank)}: {call.what} at step {call.step} failed: {result}"
                log.warning("%s", message)
                self.survivable_failures.append(message)

    # ------------------------------------------------------------- training
    def train(
        self,
        trajectories: Sequence,
        tag_weights,
        group_weights: Mapping[str, float] | None = None,
        policy_version: int | None = None,
        partial: bool = False,
    ) -> GroupCall:
        """Start one step on every rank: groups split by ``shard_batch``; ``tag_weights`` may be an object ref."""
        self._check_pending()
        groups = len({t.group_id for t in trajectories})
        if not partial and groups % self.settings.mini_batch_groups:
            raise ValueError(
                f"a batch must hold whole mini-batches of {self.settings.mini_batch_groups} groups; got {groups}"
            )
        shards = shard_batch(trajectories, self.settings.world_size, self.settings.mini_batch_groups)
        self.step += 1
        return self._start(
            "train_shard",
            "train step",
            lambda r: (shards[r], tag_weights, group_weights, policy_version),
            self.settings.step_timeout_s,
        )

    def done(self, call: GroupCall) -> bool:
        return self._collect(call, block=False)

    def result(self, call: GroupCall) -> LearnerStepResult:
        self._collect(call, block=True)
        return merge_results([call.results[r] for r in range(len(self.actors))])

    def train_now(
        self, trajectories: Sequence, tag_weights, group_weights=None, policy_version=None, partial=False
    ) -> LearnerStepResult:
        return self.result(self.train(trajectories, tag_weights, group_weights, policy_version, partial))

    # -------------------------------------------------------------- weights
    def weights(self, dtype: str | None = None) -> WeightManifest:
        """The weights in the generator's ``dtype`` through the object store: every rank joins the
        bucketed gathers, rank 0 puts each bucket as its own object; their manifest (small: refs)."""
        self._check_pending()
        call = self._start("weights", "weight gather", lambda r: (dtype,))
        self._collect(call, block=True)
        manifest = call.results[0]
        if not isinstance(manifest, WeightManifest):
            self._fail(
                f"{self._name(0)} returned {type(manifest).__name__} from the weight gather at step {self.step}, "
                "not a weight manifest"
            )
        return manifest

    def canary_logprobs(self, token_ids: list[int]) -> list[float]:
        """The learner's logprobs of a fixed sequence at its current weights (every rank
        joins the forward: ZeRO-3 gathers), what each replica's must match after an update."""
        return self._all("canary_logprobs", "weight canary", lambda r: (list(token_ids),))[0]

    def save_snapshot(self, out_dir: str, version: int) -> tuple[str, float]:
        return self._all("save_snapshot", "snapshot", lambda r: (out_dir, version), self.snapshot_timeout_s)[0]

    def weight_group_address(self) -> tuple[str, int]:
        return self._get_one(self.actors[0].weight_group_address.remote(), 0, "weight group")

    def join_weight_group(self, host: str, port: int, world_size: int, backend: str, dtype: str | None = None):
        """Rank 0 joins the broadcast group, sending in the generator's ``dtype`` (a ref: the generator
        joins at the same time). Ordered on rank 0: a broadcast still running ends before its group goes."""
        self._weight_join_ticket = self._tickets[0]
        return self._submit(0, "join_weight_group", host, port, world_size, backend, dtype)

    def wait_weight_group_turn(self, every_s: float = 0.2) -> None:
        """Until rank 0's join (just submitted) has its turn: the calls before it end first, a step
        among them. The receivers' joins start after this, so their clocks do not run while rank 0
        is not yet listening. Bounded as rank 0 bounds its own wait for a turn (``wait_s``)."""
        ticket = self._weight_join_ticket
        deadline = time.monotonic() + self.wait_s
        while self._get_one(self.actors[0].next_ticket.remote(), 0, "weight group") < ticket:
            if time.monotonic() > deadline:
                self._fail(
                    f"{self._name(0)}: its weight-group join (ticket {ticket}) did not get its turn "
                    f"within {self.wait_s:g} s"
                )
            time.sleep(every_s)

    def broadcast_weights(self) -> None:
        """Every rank joins the bucketed gathers, rank 0 sends. Not waited for: the ranks run their
        next call after it (tickets), and its failure surfaces at the driver's next call."""
        from weights.broadcast_group import WeightGroupError

        self._check_pending()
        # A receiver gone or stalled fails the round on rank 0 only (it still walks every ZeRO-3
        # gather): the group is whole, the run goes on, the round is counted (``survivable_failures``).
        self._pending.append(self._start("broadcast_weights", "weight broadcast", survivable=(WeightGroupError,)))

    def wait_pending(self) -> None:
        """Wait for the calls not waited for (the weight broadcast), within their timeouts."""
        for call in list(self._pending):
            self._collect(call, block=True)
            self._finished(call)

    # ---------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str, extra: Mapping[str, Any], keep: int = 0) -> str:
        return self._all("save_checkpoint", "checkpoint", lambda r: (path, extra, keep), self.checkpoint_timeout_s)[0]

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self._all("load_checkpoint", "resume", lambda r: (path,), self.checkpoint_timeout_s)[0]

    def check_storage(self, storage: Path) -> None:
        """Every rank's node writes a probe under the run's storage path; the driver must read each back."""
        try:
            check_nodes_see(storage, self.node_roles(), self.settings.timeout_s)
        except StorageError as exc:
            self._fail(str(exc))

    def node_roles(self) -> dict[str, str]:
        """Ray node id -> the ranks on it ("learner ranks 0, 1")."""
        ranks: dict[str, list[str]] = {}
        for r, node in enumerate(self.nodes):
            ranks.setdefault(node["node_id"], []).append(str(r))
        return {node: f"learner rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}" for node, rs in ranks.items()}

    def pids(self) -> list[int]:
        return self._probe_all(lambda a: a.pid.remote(), "pid")

    def comm_profile(self, enabled: bool) -> None:
        self._all("comm_profile", "comm profile", lambda r: (enabled,))

    def comm_seconds(self) -> list[float]:
        return self._all("comm_seconds", "comm profile")

    def peak_memory_gb(self) -> list[float]:
        return self._probe_all(lambda a: a.peak_memory_gb.remote(), "memory probe")

    def param_shares(self) -> list[dict[str, int]]:
        return self._all("param_share", "parameter count")

    def close(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        self.actors = []
        if self.pg is not None:
            try:
                ray.util.remove_placement_group(self.pg)
            except Exception:
                pass
            self.pg = None
