"""One generator shared by many env actors.

``GeneratorServer`` runs inside a generator actor (a Ray actor with many
concurrent calls): every caller's ``generate`` lands on one engine thread,
which merges the requests waiting at that moment into one engine batch (so
groups from different env actors decode together) and applies weight updates
between batches (so each output is stamped with one policy version).

``RemoteGenerator`` is the env actor's side: the Generator interface over a
Ray actor handle. A dead or restarting generator actor raises
GeneratorUnavailable (the orchestrator re-issues the group), never a quiet
aborted episode.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from actors.generation.replica_counters import ReplicaStats
from actors.generation.sources import as_tensors, restarted_by_ray
from rollout.generator import GenerationOutput, GenerationRequest, Generator, GeneratorUnavailable, SamplingConfig
from weights.buckets import WeightManifest

log = logging.getLogger(__name__)
# A group's reference log-probs (trainer.reference_logprobs=generator): one prefill per trajectory,
# batched beside the replica's decoding; minutes mean the replica is stuck (RemoteGenerator.reference_logprobs).
REFERENCE_TIMEOUT_S = 300.0
END_EPISODES_TIMEOUT_S = 30.0  # a pinned episode's end, told to its replica (RemoteGenerator.end_episodes)


class ReplicaEngineDead(RuntimeError):
    """A replica's vLLM engine core has died inside its live actor: it answers calls but can serve
    none. The fleet replaces it (seal/runtime/generator_fleet.py) rather than restore it for ever."""


@dataclass
class _Job:
    kind: str  # generate | update (new weights: a callable returning seconds) | call (any other engine call)
    args: tuple
    future: Future = field(default_factory=Future)


@dataclass
class ServerCounters:
    batches: int = 0
    requests: int = 0
    generated_tokens: int = 0
    busy_s: float = 0.0  # the engine generating or loading weights
    update_s: float = 0.0
    updates: int = 0
    # Requests a caller waits on (queued or in the engine): what a kill of this process would fail now.
    outstanding: int = 0
    started: float = field(default_factory=time.perf_counter)
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)  # as ReplicaCounters': a restart is a new one

    def stats(self, policy_version: int) -> ReplicaStats:
        """What ``GeneratorServer.stats()`` answers: the counters both engines keep, the async
        engine's own at 0 (actors/generation/replica_counters.py ReplicaStats)."""
        return ReplicaStats(
            instance=self.instance,
            policy_version=policy_version,
            requests=self.requests,
            generated_tokens=self.generated_tokens,
            outstanding=self.outstanding,
            outstanding_tokens=0,  # not counted: one engine, no router balancing on it
            busy_s=self.busy_s,
            updates=self.updates,
            update_s=self.update_s,
            wall_s=time.perf_counter() - self.started,
            batches=self.batches,
            finished=self.requests,  # counted once generated
            continued=0,
            prompt_tokens=0,
            cached_prompt_tokens=0,
            prefix_cache_hit_rate=None,  # the blocking engine keeps no prefix cache statistics
            prefix_cache_reset_refused=0,
            drain_timeouts=0,
            failed_updates=0,
        )


class GeneratorServer:
    def __init__(
        self, make_generator: Callable[[], Generator], max_batch_requests: int = 256, await_weights: bool = False
    ) -> None:
        """``await_weights``: hold generate calls until the first weight update
        (a restarted generator must not serve the base weights as if current). An update that
        fails part way (the generator's ``weights_whole`` False after it) holds them the same
        way until a whole version lands."""
        self.generator = make_generator()
        self.max_batch_requests = max_batch_requests
        self.counters = ServerCounters()
        self._outstanding_lock = threading.Lock()
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._front: deque[_Job] = deque()  # taken from the queue but not yet served, in arrival order
        self._awaiting_weights = await_weights or restarted_by_ray()
        threading.Thread(target=self._engine_loop, name="generator-engine", daemon=True).start()

    # ------------------------------------------------------- called remotely
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[GenerationOutput]:
        job = _Job("generate", (list(requests), sampling))
        with self._outstanding_lock:  # callers arrive on many threads of the actor
            self.counters.outstanding += len(job.args[0])
        try:
            self._jobs.put(job)
            return job.future.result()
        finally:
            with self._outstanding_lock:
                self.counters.outstanding -= len(job.args[0])

    def update_weights(self, version: int, source: str | Mapping[str, Any] | WeightManifest) -> float:
        """A snapshot directory, the learner's WeightManifest (its buckets fetched and loaded one
        at a time on the engine thread) or a name -> array mapping; seconds the load took."""
        return self._on_engine("update", lambda: self.generator.update_weights(version, as_tensors(source)))

    def join_weight_group(
        self, host: str, port: int, world_size: int, backend: str, rank: int, timeout_s: float
    ) -> list[int]:
        """Join the learner's weight broadcast group, this engine's workers from ``rank`` on (vLLM
        generators with weight_sync=broadcast); blocks until every member has joined (``timeout_s``)."""
        return self._on_engine(
            "call",
            lambda: self.generator.init_weight_group(  # type: ignore[attr-defined]  # the vLLM engine's
                host, port, world_size, rank=rank, backend=backend, timeout_s=timeout_s
            ),
        )

    def update_weights_from_group(self, version: int, metadata: list) -> float:
        """Receive one broadcast round from the learner (sent concurrently)."""
        return self._on_engine("update", lambda: self.generator.update_weights_from_group(version, metadata))  # type: ignore[attr-defined]

    def _on_engine(self, kind: str, fn: Callable[[], Any]) -> Any:
        job = _Job(kind, (fn,))
        self._jobs.put(job)
        return job.future.result()

    def policy_version(self) -> int:
        return self.generator.policy_version

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """The weight-sync canary, between batches like every engine call."""
        return self._on_engine("call", lambda: self.generator.prompt_logprobs(token_ids))  # type: ignore[attr-defined]

    def reference_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """The base model's log-probs (trainer.reference_logprobs=generator), between batches."""
        return self._on_engine("call", lambda: self.generator.reference_logprobs(sequences))

    def dtype(self) -> str:
        """The generator's resolved dtype (bfloat16 | float32): the learner sends weights in it."""
        return str(getattr(self.generator, "dtype", "float32"))

    def max_model_len(self) -> int:
        return self.generator.max_model_len

    def stats(self) -> ReplicaStats:
        return self.counters.stats(self.generator.policy_version)

    def pid(self) -> int:
        return os.getpid()

    def awaiting_weights(self) -> bool:
        """The fleet's probe; ``ReplicaEngineDead`` once the generator's engine core has died."""
        if getattr(self.generator, "engine_dead", lambda: False)():
            raise ReplicaEngineDead(f"generator replica (pid {os.getpid()}): its vLLM engine core is dead")
        return self._awaiting_weights

    # ------------------------------------------------------------- engine
    def _next_job(self, block: bool) -> _Job | None:
        if self._front:
            return self._front.popleft()
        try:
            return self._jobs.get(block=block)
        except queue.Empty:
            return None

    def _take_batch(self) -> list[_Job]:
        """The first waiting job, and if it generates, every waiting generate
        job with the same sampling config (up to the request cap). Anything
        else ends the batch and is held for the next one (arrival order kept),
        so versions only move between engine calls."""
        first = self._next_job(block=True)
        assert first is not None  # a blocking take always has one
        if first.kind != "generate":
            return [first]
        batch, size = [first], len(first.args[0])
        while size < self.max_batch_requests:
            job = self._next_job(block=False)
            if job is None:
                break
            if job.kind != "generate" or job.args[1] != first.args[1]:
                self._front.appendleft(job)
                break
            batch.append(job)
            size += len(job.args[0])
        return batch

    def _engine_loop(self) -> None:
        parked: list[_Job] = []
        while True:
            batch = self._take_batch()
            if self._awaiting_weights and batch[0].kind == "generate":
                parked.extend(batch)
                continue
            t0 = time.perf_counter()
            try:
                if batch[0].kind == "call":
                    batch[0].future.set_result(batch[0].args[0]())
                elif batch[0].kind == "update":
                    seconds = batch[0].args[0]()
                    self.counters.updates += 1
                    self.counters.update_s += seconds
                    batch[0].future.set_result(seconds)
                    if self._awaiting_weights:
                        self._awaiting_weights = False
                        self._front.extend(parked)
                        parked = []
                else:
                    requests = [r for job in batch for r in job.args[0]]
                    outputs = self.generator.generate(requests, batch[0].args[1])
                    self.counters.batches += 1
                    self.counters.requests += len(requests)
                    self.counters.generated_tokens += sum(len(o.token_ids) for o in outputs)
                    k = 0
                    for job in batch:
                        job.future.set_result(outputs[k : k + len(job.args[0])])
                        k += len(job.args[0])
            except Exception as exc:  # the callers get the engine's error
                if batch[0].kind == "update" and not getattr(self.generator, "weights_whole", True):
                    self._awaiting_weights = True  # a mix of two versions: nothing is served until a whole one
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
            self.counters.busy_s += time.perf_counter() - t0


class RemoteGenerator(Generator):
    """The Generator interface over a GeneratorServer actor handle."""

    def __init__(self, handle: Any, tokenizer: Any = None) -> None:
        import ray

        self._handle = handle
        self._tokenizer = tokenizer
        self.max_model_len = self._call(lambda: ray.get(handle.max_model_len.remote()))

    @staticmethod
    def _call(fn):
        import ray.exceptions

        try:
            return fn()
        except ray.exceptions.RayActorError as exc:  # died, restarting or unreachable
            raise GeneratorUnavailable(f"generator actor unavailable: {exc.__class__.__name__}") from None

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        import ray

        return self._call(lambda: ray.get(self._handle.policy_version.remote()))

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[GenerationOutput]:
        import ray

        return self._call(lambda: ray.get(self._handle.generate.remote(list(requests), sampling)))

    def update_weights(self, version: int, source: str | Mapping[str, Any] | WeightManifest) -> float:
        import ray

        return self._call(lambda: ray.get(self._handle.update_weights.remote(version, source)))

    def reference_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The replica's base-model log-probs of ``sequences``, within ``REFERENCE_TIMEOUT_S``: a replica
        gone or past it is unavailable (the group is re-issued, as when it fails mid-episode)."""
        import ray
        import ray.exceptions

        ref = self._handle.reference_logprobs.remote([list(s) for s in sequences])
        try:
            return self._call(lambda: ray.get(ref, timeout=REFERENCE_TIMEOUT_S))
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref)
            raise GeneratorUnavailable(
                f"generator replica: no reference log-probs for {len(sequences)} sequences in {REFERENCE_TIMEOUT_S:.0f} s"
            ) from None

    def end_episodes(self, episode_ids: Sequence[str]) -> None:
        """Tell the replica its pinned episodes are over, within ``END_EPISODES_TIMEOUT_S``. A replica
        gone or slow keeps their pins until they idle out (actors/generation/episode_pins.py): the
        episodes are finished either way, so nothing is raised."""
        import ray
        import ray.exceptions

        try:
            ray.get(self._handle.end_episodes.remote(list(episode_ids)), timeout=END_EPISODES_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            log.warning("generator replica: ending %d pinned episodes failed (%s)", len(episode_ids), exc)
