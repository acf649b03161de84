"""Policy versions as LoRA adapters on the async replica (actors/generation/async_vllm_engine.py).

A replica started with ``max_lora_rank`` > 0 serves the base model once and each published
version as a vLLM LoRA adapter: an update carries the adapter's tensors alone (megabytes; the
learner's ``adapter_tensors``, learner/lora.py), by either weight-sync path:

- records (``update_weights``): the learner's WeightManifest of adapter tensors, fetched bucket by
  bucket from Ray's object store in the replica's process (or a name -> tensor mapping, or a peft
  adapter directory);
- the broadcast group (``update_weights_from_group``): one round received by the engine's workers
  (``WeightSyncExtension.receive_adapter``, with the group's "ready" handshake and per-operation
  bounds as for whole weights).

Either way the tensors become peft's adapter directory on the replica's disk
(actors/generation/adapters.py ``write_adapter_files``) and vLLM loads it eagerly (``add_lora``: a
bad adapter fails the update within ``update_timeout_s``, not a later request). The base weights
never change, so no update pauses the engine, and one that fails leaves the replica serving the
version it had, whole.

Requests in flight at an update (``update_mode``):

- ``pause``: they finish on the adapter they started with, which stays loaded until no request uses
  it (``ServedAdapters``); new requests take the new one at once (no drain to wait for);
- ``keep`` and ``abort``: they are aborted and continued on the new adapter, their tokens so far
  kept (a vLLM request's adapter is fixed, so ``keep``'s frozen KV cache cannot carry over).

Every span carries the version of the adapter that sampled it. vLLM's own per-token label
(``set_weight_version``) is engine-wide, so under adapters an old request's tokens would carry the
newest version: the label is dropped and the version the piece started on stands.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from actors.generation.adapters import ServedAdapters, read_adapter_files, write_adapter_files
from actors.generation.episode_pins import EpisodePins
from actors.generation.sources import as_tensors
from actors.generation.weight_updates import begin_update, count_update, within_update_timeout
from weights.buckets import WeightManifest, fetch_bucket_async

BASE_LOGPROB_TRIES = 3  # a reference request aborted by this many keep/abort-mode updates in a row fails


def scored_prompt(token_ids: Sequence[int], output: Any, who: str) -> list[float]:
    """The log-prob of each token after the first from a vLLM output asked for ``prompt_logprobs=0``."""
    steps = getattr(output, "prompt_logprobs", None)
    if not steps or len(steps) != len(token_ids):
        raise RuntimeError(
            f"{who}: vLLM returned {len(steps or [])} prompt log-probs for {len(token_ids)} tokens "
            f"(finish: {getattr(getattr(output, 'outputs', [None])[0], 'finish_reason', None)})"
        )
    return [float(step[tok].logprob) for tok, step in zip(list(token_ids)[1:], steps[1:])]


def engine_stream(replica: Any, prompt: Any, params: Any, request_id: str, version: int):
    """One engine request's outputs on ``replica``'s engine; serving adapters, on the one of ``version``."""
    if replica.adapters is not None:
        return replica.adapters.stream(replica._engine, prompt, params, request_id, version)
    return replica._engine.generate(prompt, params, request_id=request_id)


class AdapterUpdates:
    """The adapter side of one ``AsyncVllmGenerator`` (``replica``): its updates and its requests' LoRAs."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica
        self.served = ServedAdapters(tempfile.mkdtemp(prefix=f"seal-adapters-{os.getpid()}-"))
        self.written_bytes = 0  # the last adapter's files
        self.pins = EpisodePins()  # trainer.episode_version=pinned: each live episode's version

    def version_for(self, req: Any, newest: int) -> int:
        """The version a piece of ``req`` (a GenerationRequest of a pinned episode) runs on."""
        who = f"generator replica pid {os.getpid()} (request {req.request_id})"
        return self.pins.pin(req.episode_id, req.pin_version, newest, self.served.loaded(), who)

    async def end_episodes(self, engine: Any, episode_ids: list[str]) -> int:
        """Pinned episodes are over: their pins go, and with them any adapter nothing holds now."""
        ended = self.pins.end(episode_ids)
        await self.served.drop_unused(engine, self.pins.held())
        return ended

    # ------------------------------------------------------------ requests
    async def stream(self, engine: Any, prompt: Any, params: Any, request_id: str, version: int):
        """One engine request on the adapter of ``version`` (the base model before any), held loaded
        until the request ends; its outputs without vLLM's engine-wide version label."""
        lora = self.served.acquire(version)
        try:
            async for out in engine.generate(prompt, params, request_id=request_id, lora_request=lora):
                for completion in out.outputs:
                    completion.weight_versions = None  # the caller labels the piece with ``version``
                yield out
        finally:
            self.served.release(version)
            if version != self.served.newest and not self.served.users(version):
                await self.served.drop_unused(engine, self.pins.held())

    async def base_logprobs(self, engine: Any, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Prompt log-probs of each sequence on the base model (no adapter), all submitted at once so the
        engine batches them beside the episodes it is decoding. The base never changes (adapter updates
        leave it), so no update is waited for; one of ``update_mode`` keep or abort aborts whatever is
        in flight, and a request it aborted is asked again (at most ``BASE_LOGPROB_TRIES`` times)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        tag = f"reference-{os.getpid()}-{time.monotonic_ns()}"
        base = await self.served.base(engine)  # not None: see ServedAdapters.base

        async def one(i: int, ids: Sequence[int]) -> list[float]:
            who = f"generator replica pid {os.getpid()} (reference {tag}-{i})"
            for attempt in range(BASE_LOGPROB_TRIES):
                epoch, final = self.replica._abort_epoch, None
                prompt = TokensPrompt(prompt_token_ids=list(ids))
                async for out in engine.generate(prompt, params, request_id=f"{tag}-{i}-{attempt}", lora_request=base):
                    final = out
                if self.replica._abort_epoch == epoch or getattr(final, "prompt_logprobs", None):
                    break  # scored, or failed on its own (scored_prompt says how)
            return scored_prompt(ids, final, who)

        return list(await asyncio.gather(*(one(i, ids) for i, ids in enumerate(sequences))))

    # ------------------------------------------------------------- updates
    async def from_source(self, version: int, source: Any, mode: str | None) -> float:
        """``update_weights``: a manifest or mapping of adapter tensors, or a peft adapter directory."""

        async def write(engine: Any) -> None:
            out = self.served.directory(version)
            if isinstance(source, str):
                if not os.path.isdir(source):
                    raise FileNotFoundError(f"adapter directory not found: {source}")
                tensors = read_adapter_files(source)  # peft's own layout: copied as it is
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(source, out)
                self.written_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
                return
            tensors = await self._fetch(source, version)
            _, self.written_bytes = write_adapter_files(out, tensors)

        return await self._update(version, mode, write)

    async def _fetch(self, source: Mapping[str, Any] | WeightManifest, version: int) -> dict[str, Any]:
        r = self.replica
        if not isinstance(source, WeightManifest):
            return dict(as_tensors(source))  # type: ignore[arg-type]
        who = f"generator replica pid {os.getpid()} loading adapter v{version}"
        tensors: dict[str, Any] = {}
        for i in range(len(source.buckets)):
            tensors.update(await fetch_bucket_async(source, i, who, r.update_timeout_s))
        return tensors

    async def from_group(self, version: int, metadata: list, mode: str | None) -> float:
        """``update_weights_from_group``: one broadcast round of adapter tensors into the workers."""

        async def write(engine: Any) -> None:
            await engine.collective_rpc(
                "receive_adapter", kwargs={"metadata": list(metadata), "directory": str(self.served.directory(version))}
            )

        return await self._update(version, mode, write)

    async def _update(self, version: int, mode: str | None, write) -> float:
        r = self.replica
        mode, engine = await begin_update(r, version, mode)
        async with r._update_lock:
            t0 = time.perf_counter()
            await within_update_timeout(r, self._load(engine, version, write), f"adapter update to v{version}")
            if mode != "pause":  # in flight: aborted, continued on the new adapter (_complete)
                r._abort_epoch += 1
                await engine.pause_generation(mode="abort", clear_cache=False)
                await engine.resume_generation()
            await self.served.drop_unused(engine, self.pins.held())
            return count_update(r, t0)

    async def _load(self, engine: Any, version: int, write) -> None:
        await write(engine)
        await self.served.add(engine, version)
        r = self.replica
        # No await between the adapter becoming the newest and the replica's version: a piece that
        # reads the version (and takes its adapter) sees both or neither.
        r._version = version
        r._awaiting_weights = False
        r._serving.set()

    def close(self) -> None:
        shutil.rmtree(self.served.root, ignore_errors=True)
