"""Rows of scripts/gpu_check.sh (seal/commands/gpu_check.py) that each answer one finding of issue 46
on a GPU, where the fix was read against vLLM, torch and NCCL but never run:

- ``failed round`` (item 2): an async replica on the GPU (the tiny model, fp32) takes a load that
  fails part way in keep mode with a request in flight. The engine must hold no request (aborted,
  not resumed on the mix), the replica must await a whole version, its logprobs must equal an HF
  forward of the old weights with the one module the load finished (each module old or new), and a
  whole version must set the request going with spans [old, new]. One GPU cannot hold both ends of
  an NCCL weight group, so the load comes as records (the restore's path, the same abort and hold).
- ``head chunk size`` (item 6): the chunked output head's forward and backward on Qwen2.5-7B's head
  (152064 x 3584, 2048 scored tokens, bf16 autocast) at 64 rows and at the CUDA default, timed, and
  the head's gradient of each against an fp32 full-logits one (the in-place ``addmm`` accumulation).
- ``silent receiver`` (items 7 and 8): the NCCL weight group of rank 0 and two receivers, formed
  non-blocking (item 8); one receiver is SIGSTOPped after the join, rank 0 gives the round up at its
  ready wait, and the other receiver must end its round within seconds with rank 0's reason, not
  wait out its first-operation bound. Three GPUs (NCCL forms no group with two ranks on one device):
  skipped with fewer.

``--device cpu`` runs each on the CPU (gloo, small shapes): a dry run of the row itself.
"""

from __future__ import annotations

import asyncio
import glob
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from actors.generation.async_vllm_engine import AsyncVllmGenerator
from learner.token_logprobs import _ADDMM_OUT_DTYPE, chunk_rows, chunked_token_logprobs, full_token_logprobs
from rollout.generator import GenerationRequest, SamplingConfig
from seal.commands.gpu_check_row import Row, has
from weights.model_assets import prepare_tiny_model

ROW_NAMES = (
    "failed round, keep mode (issue 46 item 2)",
    "head chunk size (issue 46 item 6)",
    "silent receiver (issue 46 items 7, 8)",
)
PROMPT = [1, 17, 4021, 88, 913, 2049, 31, 7, 605, 12]
DOWN, Q = "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"


def issue46_rows(device: str = "cuda") -> list[Row]:
    rows = []
    for name, fn in zip(ROW_NAMES, (failed_round_row, head_chunk_row, silent_receiver_row)):
        try:
            rows.append(fn(name, device))
        except Exception as exc:  # a row that breaks is that row's finding
            rows.append(
                Row(name, "FAIL", f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            )
    return rows


# ------------------------------------------------------------------------------ item 2
def _hf_logprobs(path: str, weights: dict, device: str) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).to(device)
    model.load_state_dict({k: v.to(device) for k, v in weights.items()}, strict=False)
    model.tie_weights()
    ids = torch.tensor([PROMPT], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


def failed_round_row(name: str, device: str) -> Row:
    if not has("vllm"):
        return Row(name, "skipped: vLLM is not installed")

    from safetensors.torch import load_file

    path = str(prepare_tiny_model())
    old: dict[str, Any] = {}
    for f in sorted(glob.glob(f"{path}/*.safetensors")):
        old.update(load_file(f))
    new = {**{k: v * 1.1 for k, v in old.items()}, DOWN: -2.0 * old[DOWN]}
    import torch

    failing = {DOWN: new[DOWN], Q: new[Q], "model.layers.0.no_such.weight": torch.zeros(3)}
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro, timeout: float = 600.0):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    async def call(fn):
        return fn()

    gen = AsyncVllmGenerator(
        path,
        device=device,
        dtype="float32",
        max_model_len=8192,
        cpu_kv_cache_gb=1,
        gpu_memory_utilization=0.3,
        update_timeout_s=600.0,
    )
    try:
        run(gen.max_model_len())
        run(gen.update_weights(1, old))
        budget = 8000 if device == "cuda" else 1500
        frozen = asyncio.run_coroutine_threadsafe(
            gen.generate(
                [GenerationRequest("frozen", PROMPT, budget, 1)], SamplingConfig(temperature=1.0, max_new_tokens=budget)
            ),
            loop,
        )
        time.sleep(0.5)
        failed = ""
        try:
            run(gen.update_weights(2, failing, mode="keep"))
        except Exception as exc:  # the failure is the point
            failed = exc.__class__.__name__
        early = frozen.done()
        in_engine = run(call(gen._engine.get_num_unfinished_requests))
        awaiting = gen.awaiting_weights()
        got = run(gen.prompt_logprobs(PROMPT))
        want = _hf_logprobs(path, {**old, DOWN: new[DOWN]}, device)
        gap = max(abs(a - b) for a, b in zip(got, want)) if len(got) == len(want) else float("inf")
        run(gen.update_weights(2, new))
        out = frozen.result(600)[0]
        spans = [s.policy_version for s in out.version_spans()]
    finally:
        run(gen.close())
        loop.call_soon_threadsafe(loop.stop)
    ok = bool(failed) and not early and in_engine == 0 and awaiting and gap < 1e-3 and spans == [1, 2]
    return Row(
        name,
        "ok" if ok else "FAIL",
        f"load failed ({failed or 'did not fail'}); requests in the engine after it {in_engine} (want 0), "
        f"awaiting a whole version {awaiting}; logprobs vs old-with-the-finished-module {gap:.1e} (< 1e-3); "
        f"the frozen request's spans {spans} (want [1, 2])" + ("; it finished before the round" if early else ""),
    )


# ------------------------------------------------------------------------------ item 6
def head_chunk_row(name: str, device: str) -> Row:
    import torch

    vocab, dim, tokens = (152064, 3584, 2048) if device == "cuda" else (49152, 576, 256)
    gen = torch.Generator(device="cpu").manual_seed(0)
    weight = (torch.randn(vocab, dim, generator=gen) * 0.02).to(device).requires_grad_()
    hidden = torch.randn(tokens, dim, generator=gen).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(rows: int | None) -> tuple[float, Any]:
        weight.grad = hidden.grad = None
        sync()
        t0 = time.perf_counter()
        if rows is None:  # the fp32 reference: full logits, no autocast
            logp, _ = full_token_logprobs(hidden, weight, targets, with_entropy=False)
        else:
            with torch.autocast(device, dtype=torch.bfloat16):
                logp, _ = chunked_token_logprobs(hidden, weight, targets, rows=rows, entropy_grad=False)
        (logp * torch.linspace(-1, 1, tokens, device=device)).sum().backward()
        sync()
        return time.perf_counter() - t0, weight.grad.detach().clone()

    _, want = step(None)
    default = chunk_rows(vocab, device_type=device)
    seconds, gaps = {}, {}
    for rows in (64, default):
        step(rows)  # warm-up
        times = []
        for _ in range(3):
            t, grad = step(rows)
            times.append(t)
        seconds[rows] = sorted(times)[1]
        gaps[rows] = float((grad - want).abs().max() / want.abs().max())
    faster = seconds[default] <= seconds[64] * 1.05 or device != "cuda"  # CPU timings (shared cores) say little

    cuda_addmm = device == "cuda" and _ADDMM_OUT_DTYPE[0]
    accumulate = "in-place addmm, fp32 out_dtype" if cuda_addmm else "the product's fp32 sum"
    ok = faster and max(gaps.values()) < 3e-2 and (cuda_addmm or device != "cuda")
    return Row(
        name,
        "ok" if ok else "FAIL",
        f"head gradient by {accumulate}; "
        f"{vocab}x{dim} head, {tokens} scored tokens, bf16, forward + backward: 64 rows {seconds[64] * 1e3:.1f} ms, "
        f"{default} rows {seconds[default] * 1e3:.1f} ms ({seconds[64] / seconds[default]:.2f}x); head gradient vs "
        f"fp32 full logits, max relative {gaps[64]:.1e} / {gaps[default]:.1e} (< 3e-2)",
    )


# ------------------------------------------------------------------------------ items 7 and 8
def _receiver(port: int, rank: int, backend: str, device: str, report: Any) -> None:
    """Rank 1 begins round 1 and reports how it ended; rank 2 joins and then stays silent."""
    import torch

    from weights.broadcast_group import WeightGroup, WeightGroupError

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    group = WeightGroup("127.0.0.1", port, rank, 3, backend, device, timeout_s=600.0, label=f"row receiver {rank}")
    report.put(("joined", rank, time.time(), ""))
    if rank == 2:
        time.sleep(600)  # SIGSTOPped by the row before rank 0 begins the round
        return
    try:
        group.begin_round()
        group.broadcast(torch.empty(4, device=device), "t0")
        report.put(("received", rank, time.time(), ""))
    except WeightGroupError as exc:
        report.put(("ended", rank, time.time(), str(exc)))


def silent_receiver_row(name: str, device: str) -> Row:
    import torch

    from weights.broadcast_group import WeightGroup, WeightGroupError

    if device == "cuda" and torch.cuda.device_count() < 3:
        return Row(
            name,
            f"skipped: needs 3 GPUs, {torch.cuda.device_count()} visible",
            "NCCL forms no group with two ranks on one device; tests/integration/test_weight_group.py runs it on gloo",
        )
    backend = "nccl" if device == "cuda" else "gloo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    devices = {r: (f"cuda:{r}" if device == "cuda" else "cpu") for r in (0, 1, 2)}
    procs = {r: ctx.Process(target=_receiver, args=(port, r, backend, devices[r], report), daemon=True) for r in (1, 2)}
    for p in procs.values():
        p.start()
    t0 = time.monotonic()
    group = WeightGroup("127.0.0.1", port, 0, 3, backend, devices[0], timeout_s=20.0, label="row rank 0")
    formed = time.monotonic() - t0
    try:
        joined = {report.get(timeout=120)[1] for _ in range(2)}
        os.kill(procs[2].pid, signal.SIGSTOP)  # alive, holding its connections, saying nothing
        cause = ""
        try:
            group.begin_round()  # waits for every receiver's "ready" at most half of 20 s
        except WeightGroupError as exc:
            cause = str(exc)
        gave_up = time.time()
        kind, _, at, message = report.get(timeout=120)
    finally:
        os.kill(procs[2].pid, signal.SIGCONT)
        group.close()
        for p in procs.values():
            p.kill()
            p.join(10)
    lag = at - gave_up
    ok = joined == {1, 2} and "never said they were ready" in cause and kind == "ended"
    ok = ok and "rank 0 gave round 1 up" in message and lag < 5.0
    return Row(
        name,
        "ok" if ok else "FAIL",
        f"{backend} group of 3 formed in {formed:.1f} s; rank 0 gave the round up at its ready wait; the ready "
        f"receiver's round {kind} {lag:+.1f} s after (its own bound: 600 s), "
        f"{'with' if 'rank 0 gave round 1 up' in message else 'without'} rank 0's reason",
    )


def main() -> int:  # python -m seal.commands.gpu_check_rows [cpu]: these rows alone

    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    rows = issue46_rows(device)
    print(json.dumps([r.__dict__ for r in rows], indent=1))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
