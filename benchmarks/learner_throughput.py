"""Learner figures on CPU: one GRPO step per backend (torch, ZeRO-2, ZeRO-3), side by side.

Synthetic groups of trajectories (a prompt, generated spans, behaviour
logprobs) with the embedded model; per backend: seconds per optimizer step,
samples/s, tokens/s, and the snapshot latency (``save_snapshot``: full weights to a
safetensors snapshot; ``publish_s`` in the report). Backends alternate round by round so they see the same load.
Then the two ways weights reach vLLM, per backend, with vLLM CPU in a child
process: the saved snapshot reloaded from disk, and the weight group
(weights/broadcast_group.py, gloo): seconds from the learner's first send to the
last, seconds until vLLM has loaded them, and the first token after it (a
prompt of --prompt-tokens, the prefix cache just reset, so a full prefill).
Prints tables and writes JSON (default benchmarks/results/learner_throughput.json).

    .venv/bin/python benchmarks/learner_throughput.py [--model embedded] [--groups 2] [--n 4] [--tokens 128] [--rounds 2] [--no-broadcast]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import socket
import tempfile
import time
from typing import TYPE_CHECKING

from _report import write_report

from actors.generation.vllm_engine import VllmGenerator
from env_pool import tags as T
from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from replay.messages import Segment, Trajectory
from rollout.generator import GenerationRequest, SamplingConfig
from weights.model_assets import resolve_model

if TYPE_CHECKING:
    from learner.step_result import LearnerStepResult


def synthetic_batch(groups: int, n: int, tokens: int, seed: int):
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        for i in range(n):
            prompt = tokens // 2
            ids = [rng.randrange(100, 40000) for _ in range(tokens)]
            mask = [0] * prompt + [1] * (tokens - prompt)
            logprobs = [(-rng.uniform(0.1, 5.0) if m else 0.0) for m in mask]
            out.append(
                Trajectory(
                    task_id=f"t{g}",
                    category="base",
                    env="synthetic",
                    group_id=f"s{seed}g{g}",
                    rollout_index=i,
                    interface_version=0,
                    token_ids=ids,
                    loss_mask=mask,
                    logprobs=logprobs,
                    prompt_length=prompt,
                    segments=[Segment(prompt, tokens, 0)],
                    reward=float(i % 2),
                    success=bool(i % 2),
                    progress=0.5,
                    tags=[T.PASS if i % 2 else T.EMPTY_TURN],
                    labels=[T.PASS],
                    error_type=None,
                    outcome="completed",
                    num_tool_calls=0,
                    num_steps=1,
                )
            )
    return out


def rss_gb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return 0.0


HOST = "127.0.0.1"


def first_token_s(gen, prompt: list[int]) -> float:
    t = time.perf_counter()
    gen.generate([GenerationRequest("ft", prompt, 1)], SamplingConfig(temperature=0.0, max_new_tokens=1))
    return time.perf_counter() - t


def vllm_side(model: str, port: int, prompt_tokens: int, conn) -> None:
    """Rank 1 of the weight group: vLLM CPU on the same model, loading each round the parent announces."""
    gen = VllmGenerator(model, max_model_len=max(2048, prompt_tokens + 16), cpu_kv_cache_gb=1, weight_sync="broadcast")
    prompt = [random.Random(0).randrange(100, 40000) for _ in range(prompt_tokens)]
    first_token_s(gen, prompt)  # warm-up
    gen.reset_prefix_cache()
    baseline = first_token_s(gen, prompt)
    gen.init_weight_group(HOST, port, world_size=2, timeout_s=600)
    conn.send({"first_token_s_before": baseline})
    while (msg := conn.recv()) is not None:
        version, metadata, snapshot = msg
        # The parent is sending already: receive first, or its clock counts our other work.
        out = {"receive_s": gen.update_weights_from_group(version, metadata)}
        out["first_token_s"] = first_token_s(gen, prompt)
        out["reload_s"] = gen.update_weights(version, snapshot)  # the existing path, same weights, for comparison
        conn.send(out)
    gen.close()


class VllmPeer:
    """vLLM in a child process, joined to this process (rank 0) by the weight group."""

    def __init__(self, model: str, prompt_tokens: int) -> None:
        from learner.weight_broadcast import WeightBroadcaster

        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=vllm_side, args=(model, port, prompt_tokens, child), daemon=True)
        self.proc.start()
        self.broadcaster = WeightBroadcaster(HOST, port, world_size=2, backend="gloo", timeout_s=600)
        self.before = self.conn.recv()

    def round(self, learner, version: int, snapshot: str) -> dict:
        self.conn.send((version, learner.weights_out.weight_metadata(), snapshot))
        sent = learner.weights_out.broadcast_weights(self.broadcaster)  # vLLM is receiving meanwhile
        return {"broadcast_s": sent, **self.conn.recv()}

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=120)
        self.broadcaster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per trajectory (half generated)")
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="prompt of the first-token measurement")
    parser.add_argument("--no-broadcast", action="store_true", help="skip the vLLM weight-path measurements")
    parser.add_argument("--out", default="benchmarks/results/learner_throughput.json")
    args = parser.parse_args()

    path = str(resolve_model(args.model))
    load_before = os.getloadavg()[0]
    backends = {"torch": ("torch", 0), "zero2": ("deepspeed", 2), "zero3": ("deepspeed", 3)}
    learners = {}
    for name, (backend, stage) in backends.items():
        t = time.perf_counter()
        learners[name] = Learner(
            path,
            LearnerConfig(
                backend=backend, zero_stage=stage, lr=1e-6, mini_batch_groups=args.groups, micro_batch_size=args.micro
            ),
            group_size=args.n,
            world_size=1,
            timeout_s=600.0,
            step_timeout_s=3600.0,
        )
        learners[name].init_s = time.perf_counter() - t
    times: dict[str, list[LearnerStepResult]] = {k: [] for k in backends}
    for r in range(args.rounds):
        batch = synthetic_batch(args.groups, args.n, args.tokens, seed=r)
        for name, lrn in learners.items():
            times[name].append(lrn.train_batch(batch, RELEASED_BASE_WEIGHTS))
    publish, weights = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, lrn in learners.items():
            _, seconds = lrn.weights_out.save_snapshot(tmp, version=1, step=lrn.step)
            publish[name] = seconds
        if not args.no_broadcast:
            peer = VllmPeer(path, args.prompt_tokens)
            for version, (name, lrn) in enumerate(learners.items(), start=1):
                snapshot, _ = lrn.weights_out.save_snapshot(tmp, version=version, step=lrn.step)
                weights[name] = peer.round(lrn, version, str(snapshot))
            peer.close()
    load_after = os.getloadavg()[0]
    rows = []
    for name, runs in times.items():
        best = min(runs, key=lambda m: m.seconds)
        rows.append(
            {
                "backend": name,
                "init_s": learners[name].init_s,
                "step_s": best.seconds,
                "samples_per_s": best.samples_per_s,
                "tokens_per_s": best.tokens_per_s,
                "publish_s": publish[name],
                "all_step_s": [m.seconds for m in runs],
                **weights.get(name, {}),
            }
        )
    report = {
        "benchmark": "learner_throughput",
        "model": args.model,
        "batch": {"groups": args.groups, "n": args.n, "tokens": args.tokens, "micro": args.micro},
        "results": rows,
        "peak_rss_gb_all_backends": rss_gb(),
        "machine": {"cpus": os.cpu_count()},
        "outside_load_1min": {"before": load_before, "after": load_after},
    }
    if weights:
        report["weight_path"] = {
            "vllm": "cpu, fp32, in a child process",
            "group": "gloo, 127.0.0.1",
            "prompt_tokens": args.prompt_tokens,
            "first_token_s_before_any_update": peer.before["first_token_s_before"],
        }
    print(f"{'backend':<8}{'step s':>9}{'samples/s':>11}{'tokens/s':>10}{'publish s':>11}")
    for r in rows:
        print(
            f"{r['backend']:<8}{r['step_s']:>9.2f}{r['samples_per_s']:>11.2f}{r['tokens_per_s']:>10.0f}{r['publish_s']:>11.2f}"
        )
    if weights:
        print(
            f"\nweights to vLLM (CPU, gloo; first token = {args.prompt_tokens}-token prompt after the prefix-cache reset; "
            f"{peer.before['first_token_s_before']:.2f} s before any update)"
        )
        print(f"{'backend':<8}{'publish+reload s':>18}{'broadcast s':>13}{'vLLM recv s':>13}{'first tok s':>13}")
        for r in rows:
            print(
                f"{r['backend']:<8}{r['publish_s'] + r['reload_s']:>18.2f}{r['broadcast_s']:>13.2f}{r['receive_s']:>13.2f}{r['first_token_s']:>13.2f}"
            )
    print(
        f"batch: {args.groups} groups x {args.n} x {args.tokens} tokens (half generated); tokens/s counts generated tokens"
    )
    print(
        f"peak RSS (three learners in one process): {report['peak_rss_gb_all_backends']:.1f} GB; outside load {load_before:.2f} -> {load_after:.2f}"
    )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
