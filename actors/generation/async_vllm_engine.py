"""A generator replica on vLLM's async engine (AsyncLLM): continuous batching, as a Ray async actor with
``GeneratorServer``'s method names (the blocking ``VllmGenerator`` serves one batch at a time). Engine settings:
actors/generation/engine_settings.py; weights in: actors/generation/sources.py and weight_transfer.py.

Updates pause the engine (vLLM's ``pause_generation``); ``update_mode`` (docs/generator-fleet.md) says what
requests in flight do: ``pause``, finish on the old weights first, for at most ``drain_timeout_s`` (default half
the update timeout, or of a broadcast's "ready" wait, weights/broadcast_group.py ``READY_FRACTION``), then as ``abort``
(counted ``drain_timeouts``); ``keep``, freeze with their KV cache and go on under the new weights; ``abort``,
continue on the new weights as new requests holding their tokens so far (AReaL's interruptible rollouts).
Spans carry vLLM's per-token version label (``set_weight_version``); every request's ``cache_salt`` is its
version, so it never reads KV of other weights (counted: ``prefix_cache_reset_refused``). A load that fails part
way leaves each module old or new: in-flight requests are aborted and all held (``awaiting_weights``) until a
whole version lands. With ``max_lora_rank`` > 0 versions are LoRA adapters on the base and no update pauses the
engine (actors/generation/adapter_updates.py). The swap under each mode: actors/generation/weight_updates.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.generation.adapter_updates import AdapterUpdates, engine_stream
from actors.generation.engine_guard import start_guard
from actors.generation.engine_settings import SEAL_TRANSFER_BACKENDS, EngineSettings, cpu_or_cuda_backend, engine_setup
from actors.generation.replica_counters import ReplicaCounters, ReplicaStats, merge_spans, version_of
from actors.generation.server import ReplicaEngineDead
from actors.generation.sources import as_tensors, restarted_by_ray, send_weights_async
from actors.generation.weight_updates import UPDATE_MODES, Load, WholeVersionUpdates
from families.registry import turn_end_ids
from replay.messages import Segment
from rollout.generator import GenerationOutput, GenerationRequest, Generator, SamplingConfig
from weights.buckets import WeightManifest


class AsyncVllmGenerator(Generator):
    """The Generator interface with the async engine's semantics: ``generate``, ``update_weights`` and
    ``close`` are coroutines (a Ray async actor's methods run on its event loop, which AsyncLLM is
    bound to), and ``policy_version`` and ``max_model_len`` are methods, as on GeneratorServer (an
    actor handle reaches methods only). Each method says where it differs from the interface."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int = 8192,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        cpu_kv_cache_gb: float = 2.0,
        max_num_seqs: int = 256,
        seed: int = 0,
        initial_version: int = 0,
        update_mode: str = "pause",
        weight_sync: str = "reload",
        update_timeout_s: float,  # generator.update_timeout_s (configs/generator/vllm_async_*.yaml)
        drain_timeout_s: float | None = None,
        await_weights: bool = False,
        setup: Callable[[], Any] | None = None,
        max_lora_rank: int = 0,
        max_loras: int = 2,
    ) -> None:
        """``setup``: called first, in this process (the cluster's CPU pinning). The engine keywords
        go to ``EngineSettings`` (actors/generation/engine_settings.py), which checks them; the
        engine itself starts on first use (``_ready``)."""
        if setup is not None:
            setup()
        settings = EngineSettings(
            model_path=model_path,
            engine="async",
            device=device,
            dtype=dtype,
            max_model_len=int(max_model_len),
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            # The engine core is a process of its own; its threads follow this process's CPU
            # pinning (cluster.generator.cpus), not vLLM's own binding.
            cpu_threads_bind="nobind",
            cpu_kv_cache_gb=cpu_kv_cache_gb,
            max_num_seqs=max_num_seqs,
            seed=seed,
            weight_sync=weight_sync,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
        )
        if update_mode not in UPDATE_MODES:
            raise ValueError(f"update_mode must be one of {sorted(UPDATE_MODES)}, got {update_mode!r}")
        if drain_timeout_s is not None and not 0 < float(drain_timeout_s) < float(update_timeout_s):
            raise ValueError(
                f"drain_timeout_s must be > 0 and below update_timeout_s ({float(update_timeout_s):g}), "
                f"got {drain_timeout_s}"
            )
        prepared = engine_setup(settings)
        prepared.apply_env()
        self.settings = prepared.settings  # resolved: the model directory, bfloat16 | float32
        self._engine_kwargs = prepared.kwargs
        self.device = device
        self.model_path = prepared.settings.model_path
        self._version = int(initial_version)  # policy_version(): a method, as on GeneratorServer
        self.update_mode = update_mode
        self.weight_sync = weight_sync
        self.update_timeout_s = float(update_timeout_s)
        self._drain_timeout_s = None if drain_timeout_s is None else float(drain_timeout_s)
        self._group_timeout_s: float | None = None  # the weight group's, once joined
        self.counters = ReplicaCounters()
        self._engine: Any = None
        self._stop_ids: list[int] = []  # the family's end set, read from the engine's tokenizer at start
        # Made on the actor's event loop with the engine (``_ready``): asyncio's locks bind to it.
        self._start_lock: asyncio.Lock | None = None
        self._update_lock: asyncio.Lock
        self._serving: asyncio.Event  # clear while an update (or a restart's first weights) is pending
        self._no_update: asyncio.Event  # clear while an update runs (the canary waits for it)
        self._abort_epoch = 0  # bumped by each abort-mode update: an abort seen across it is ours
        self._group_ready = False
        self._awaiting_weights = await_weights or restarted_by_ray()
        self.whole_updates = WholeVersionUpdates(self)
        self.adapters = AdapterUpdates(self) if max_lora_rank else None

    # -------------------------------------------------------------- engine
    async def _ready(self) -> Any:
        """The engine, started on first use: AsyncLLM binds to the running event loop."""
        if self._engine is not None:
            return self._engine
        if self._start_lock is None:
            self._start_lock, self._update_lock = asyncio.Lock(), asyncio.Lock()
            self._serving, self._no_update = asyncio.Event(), asyncio.Event()
            self._no_update.set()
            if not self._awaiting_weights:
                self._serving.set()
        async with self._start_lock:
            if self._engine is None:
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM

                from actors.generation.weight_transfer import register

                register()  # seal_gloo must be known before the engine's config is checked

                engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self._engine_kwargs))
                self._engine_guard = start_guard()  # its engine core dies with this actor, however it dies
                await engine.update_weight_version(str(self._version))
                # The family's whole end set (EOS, generation_config's, <|eom_id|>, <end_of_turn>, ...),
                # given explicitly: a turn ends on any of them, whatever vLLM reads by itself.
                self._stop_ids = list(turn_end_ids(engine.get_tokenizer(), self._engine_kwargs["model"]))
                self._engine = engine
        return self._engine

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer. The engine starts inside the actor's event loop on first use, so
        before that there is none: one is not loaded on the side, which could differ from vLLM's."""
        if self._engine is None:
            raise RuntimeError("the async engine has not started: await max_model_len() (or any call) first")
        return self._engine.get_tokenizer()

    # --------------------------------------------------------- generation
    async def generate(  # type: ignore[override]  # a coroutine: the class doc says why
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig
    ) -> list[GenerationOutput]:
        """Every request goes to the engine at once and is served as it finishes; the call returns when
        all of them have. A coroutine. Unlike the interface's promise, an update may land during the call
        (modes keep and abort, or a pause drain past its bound): such an output carries one span per
        version (``GenerationOutput.spans``) and ``policy_version`` is its oldest."""
        await self._ready()
        return list(await asyncio.gather(*(self._complete(r, sampling) for r in requests)))

    async def _complete(self, req: GenerationRequest, sampling: SamplingConfig) -> GenerationOutput:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        budget = len(req.prompt_ids) + int(req.max_new_tokens)
        c = self.counters
        c.enter(budget)
        ids: list[int] = []
        logprobs: list[float] = []
        spans: list[Segment] = []
        cached = 0
        finish = "abort"
        piece = 0
        try:
            while True:
                await self._serving.wait()  # a restart's first weights, or an update in progress
                remaining = int(req.max_new_tokens) - len(ids)
                if remaining <= 0:
                    finish = "length"
                    break
                params = SamplingParams(
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    max_tokens=remaining,
                    logprobs=0,
                    seed=req.seed if req.seed is not None else sampling.seed,
                    stop_token_ids=self._stop_ids,
                    output_kind=RequestOutputKind.FINAL_ONLY,
                )
                epoch, version_now = self._abort_epoch, self._request_version(req)
                final = None
                # The prefix cache is partitioned by weight version (module docstring).
                prompt = TokensPrompt(prompt_token_ids=[*req.prompt_ids, *ids], cache_salt=f"seal-v{version_now}")
                async for out in engine_stream(self, prompt, params, f"{req.request_id}#{piece}", version_now):
                    final = out
                if final is None or not final.outputs:
                    raise RuntimeError(f"vLLM returned no output for request {req.request_id}")
                out = final.outputs[0]
                new_ids = list(out.token_ids)
                new_lps = [float(step[tok].logprob) for tok, step in zip(new_ids, out.logprobs or [])]
                if len(new_lps) != len(new_ids):
                    raise RuntimeError(f"vLLM returned {len(new_lps)} logprobs for {len(new_ids)} tokens")
                offset = len(ids)
                if piece == 0:
                    cached = int(final.num_cached_tokens or 0)
                for span in out.weight_versions or ([] if not new_ids else [None]):
                    if span is None:  # the engine labelled nothing: the version when the piece started
                        spans.append(Segment(offset, offset + len(new_ids), version_now))
                    else:
                        spans.append(
                            Segment(offset + span.start, offset + span.end, version_of(span.version, version_now))
                        )
                ids.extend(new_ids)
                logprobs.extend(new_lps)
                finish = out.finish_reason or "abort"
                if finish == "abort" and self._abort_epoch != epoch:
                    piece += 1  # aborted by an abort-mode update: go on under the new weights
                    c.continued += 1
                    continue
                break
        finally:
            c.leave(budget)
        c.finished += 1
        c.generated_tokens += len(ids)
        c.prompt_tokens += len(req.prompt_ids)
        c.cached_prompt_tokens += cached
        spans = merge_spans(spans)
        oldest = min((s.policy_version for s in spans), default=self._version)
        return GenerationOutput(
            request_id=req.request_id,
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            policy_version=oldest,
            prompt_tokens=len(req.prompt_ids),
            cached_prompt_tokens=cached,
            spans=tuple(spans) if len({s.policy_version for s in spans}) > 1 else (),
        )

    # ------------------------------------------------------------ weights
    async def update_weights(  # type: ignore[override]  # a coroutine, with the update mode
        self, version: int, source: str | Mapping[str, Any] | WeightManifest, mode: str | None = None
    ) -> float:
        """Load new weights under ``mode`` (default: the configured update_mode); seconds taken. ``source``:
        a snapshot directory, the learner's WeightManifest (weights/buckets.py) or a name -> tensor mapping
        (callers in this process). A coroutine: requests are served (drained, frozen, aborted) meanwhile."""
        if self.adapters is not None:  # adapter tensors (or a peft adapter directory)
            return await self.adapters.from_source(version, source, mode)

        async def load(engine) -> None:
            await send_weights_async(
                engine.collective_rpc,
                as_tensors(source),
                f"generator replica loading v{version}",
                self.update_timeout_s,
            )

        return await self._update(version, mode, load)

    async def join_weight_group(
        self, host: str, port: int, world_size: int, backend: str, rank: int, timeout_s: float
    ) -> list[int]:
        """Join the learner's weight group; this replica's workers take ranks rank .. rank + TP - 1."""
        if self.weight_sync != "broadcast":
            raise RuntimeError("join_weight_group needs weight_sync=broadcast in the generator config")
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        from actors.generation.weight_transfer import init_info

        transfer_backend = cpu_or_cuda_backend(self.device)
        if backend != SEAL_TRANSFER_BACKENDS[transfer_backend]:
            raise ValueError(f"this replica transfers weights over {transfer_backend}; the learner asked for {backend}")
        from weights.broadcast_group import READY_FRACTION

        if self._drain_timeout_s is not None and self._drain_timeout_s >= float(timeout_s) * READY_FRACTION:
            raise ValueError(
                f"drain_timeout_s ({self._drain_timeout_s:g}) must be below {READY_FRACTION:g} of the weight "
                f"group's timeout ({float(timeout_s):g} s): the learner waits that long for a replica to drain"
            )
        engine = await self._ready()
        async with self._update_lock:  # never while a round is being received
            if self._group_ready:
                # Re-formed (a replica restored, the learner restarted): vLLM's NCCL engine would
                # replace its communicator without closing the old one; close it first.
                self._group_ready = False
                await engine.shutdown_weight_transfer_engine()
            info = init_info(
                host, port, rank, world_size, transfer_backend, timeout_s, label=f"generator replica pid {os.getpid()}"
            )
            await engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info))
            self._group_ready = True
            self._group_timeout_s = float(timeout_s)
        return list(range(int(rank), int(rank) + int(self.settings.tensor_parallel_size)))

    async def update_weights_from_group(self, version: int, metadata: list, mode: str | None = None) -> float:
        """Receive one broadcast round (the learner sends concurrently) under ``mode``."""
        from weights.broadcast_group import WeightMeta

        if not self._group_ready:
            raise RuntimeError("update_weights_from_group before join_weight_group")
        if not metadata:
            raise ValueError("empty metadata: a round carries every weight of the model")
        if self.adapters is not None:
            return await self.adapters.from_group(version, metadata, mode)
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        from actors.generation.weight_transfer import update_info

        payload = update_info(WeightMeta.from_wire(m) for m in metadata)

        async def load(engine) -> None:
            # vLLM's weight-transfer lifecycle: layerwise reload around the received tensors.
            await engine.start_weight_update()
            await engine.update_weights(WeightTransferUpdateRequest(update_info=payload))
            await engine.finish_weight_update()

        return await self._update(version, mode, load)

    async def _update(self, version: int, mode: str | None, load: Load) -> float:
        """A whole version in under ``mode`` (actors/generation/weight_updates.py); seconds taken."""
        return await self.whole_updates.run(version, mode, load)

    def drain_timeout_s(self) -> float:
        """How long a pause-mode update waits for requests in flight to finish."""
        if self._drain_timeout_s is not None:
            return self._drain_timeout_s
        from weights.broadcast_group import READY_FRACTION

        bound = (
            self.update_timeout_s
            if self._group_timeout_s is None
            else min(self.update_timeout_s, self._group_timeout_s * READY_FRACTION)
        )
        return bound / 2

    # ------------------------------------------------------- diagnostics
    def _request_version(self, req: GenerationRequest) -> int:
        """The version a piece of ``req`` runs on: the newest, or its pinned episode's (episode_pins.py)."""
        if req.episode_id is None:
            return self._version
        if self.adapters is None:
            raise ValueError(
                f"generator replica pid {os.getpid()}: episode {req.episode_id} is pinned, not served as LoRA"
            )
        return self.adapters.version_for(req, self._version)

    async def end_episodes(self, episode_ids: Sequence[str]) -> int:  # type: ignore[override]  # a coroutine
        """Pinned episodes are over (rollout/play.py): their adapters may go. Returns how many were pinned here."""
        return 0 if self.adapters is None else await self.adapters.end_episodes(await self._ready(), list(episode_ids))

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """Logprob of each token after the first under the weights loaded now (between updates, as the
        blocking server answers): the canary the driver compares with the learner's after an update."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        await self._ready()
        await self._no_update.wait()  # the weights loaded now, even while the replica holds its requests
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        final = None
        async for out in engine_stream(
            self, TokensPrompt(prompt_token_ids=list(token_ids)), params, f"canary-{time.monotonic_ns()}", self._version
        ):
            final = out
        assert final is not None, "the engine's stream ended without an output"
        steps = final.prompt_logprobs or []
        return [float(step[tok].logprob) for tok, step in zip(token_ids[1:], steps[1:])]

    async def reference_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:  # type: ignore[override]
        """The base model's log-prob of each token after the first of every sequence (no adapter): the KL
        reference under LoRA (trainer.reference_logprobs=generator). A coroutine."""
        if self.adapters is None:
            raise ValueError(
                f"generator replica pid {os.getpid()} serves whole weights, not adapters on a base: "
                "trainer.reference_logprobs=generator needs learner.cfg.lora (publish: adapter)"
            )
        self._check_engine()
        return await self.adapters.base_logprobs(await self._ready(), sequences)

    async def max_model_len(self) -> int:  # type: ignore[override]
        """Starts the engine if needed (what the pipeline's start waits on): a coroutine, not the
        interface's attribute, because an actor handle reaches methods only."""
        await self._ready()
        return self.settings.max_model_len

    def dtype(self) -> str:
        """The resolved dtype (bfloat16 | float32): the learner sends weights in it."""
        return str(self.settings.dtype)

    def policy_version(self) -> int:  # type: ignore[override]
        """The version loaded now: a method, not the interface's attribute, because an actor handle
        reaches methods only (GeneratorServer's is one too). Outputs carry their own versions."""
        return self._version

    def load(self) -> dict[str, int]:
        """What the router balances on."""
        return {"outstanding": self.counters.outstanding, "outstanding_tokens": self.counters.outstanding_tokens}

    def stats(self) -> ReplicaStats:
        return self.counters.stats(self._version)

    def pid(self) -> int:
        return os.getpid()

    def awaiting_weights(self) -> bool:
        """The fleet's probe: True while the replica holds its requests for a whole version (restarted,
        or after a failed load); ``ReplicaEngineDead`` once its engine core has died."""
        self._check_engine()
        return self._awaiting_weights

    def _check_engine(self) -> None:
        if self._engine is not None and self._engine.errored:
            raise ReplicaEngineDead(f"generator replica (pid {os.getpid()}): its vLLM engine core is dead")

    async def close(self) -> None:  # type: ignore[override]
        """A coroutine, unlike the interface's: like every call that touches the engine it runs on the
        actor's event loop, so it never lands halfway through another call's use of the engine."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
        if self.adapters is not None:
            self.adapters.close()
