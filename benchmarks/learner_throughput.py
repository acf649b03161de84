"""Learner figures on CPU: one GRPO step per backend (torch, ZeRO-2, ZeRO-3), side by side.

Synthetic groups of trajectories (a prompt, generated spans, behaviour
logprobs) with the embedded model; per backend: seconds per optimizer step,
samples/s, tokens/s, and the publish latency (full weights to a safetensors
snapshot). Backends alternate round by round so they see the same load.
Prints a table and writes JSON (default benchmarks/results/learner_throughput.json).

    .venv/bin/python benchmarks/learner_throughput.py [--model embedded] [--groups 2] [--n 4] [--tokens 128] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

from _report import write_report


def synthetic_batch(groups: int, n: int, tokens: int, seed: int):
    from env_pool import tags as T
    from replay.messages import Segment, Trajectory

    rng = random.Random(seed)
    out = []
    for g in range(groups):
        for i in range(n):
            prompt = tokens // 2
            ids = [rng.randrange(100, 40000) for _ in range(tokens)]
            mask = [0] * prompt + [1] * (tokens - prompt)
            logprobs = [(-rng.uniform(0.1, 5.0) if m else 0.0) for m in mask]
            out.append(Trajectory(
                task_id=f"t{g}", category="base", env="synthetic", group_id=f"s{seed}g{g}", rollout_index=i, interface_version=0,
                token_ids=ids, loss_mask=mask, logprobs=logprobs, prompt_length=prompt, segments=[Segment(prompt, tokens, 0)],
                reward=float(i % 2), success=bool(i % 2), progress=0.5, tags=[T.PASS if i % 2 else T.EMPTY_TURN],
                labels=[T.PASS], error_type=None, outcome="completed", num_tool_calls=0, num_steps=1,
            ))
    return out


def rss_gb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per trajectory (half generated)")
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/learner_throughput.json")
    args = parser.parse_args()

    from actors.model_assets import resolve_model
    from learner.advantages import RELEASED_BASE_WEIGHTS
    from learner.engine import Learner, LearnerConfig

    path = str(resolve_model(args.model))
    load_before = os.getloadavg()[0]
    backends = {"torch": ("torch", 0), "zero2": ("deepspeed", 2), "zero3": ("deepspeed", 3)}
    learners = {}
    for name, (backend, stage) in backends.items():
        t = time.perf_counter()
        learners[name] = Learner(path, LearnerConfig(backend=backend, zero_stage=stage, lr=1e-6, mini_batch_groups=args.groups,
                                                     micro_batch_size=args.micro), group_size=args.n)
        learners[name].init_s = time.perf_counter() - t
    times: dict[str, list[dict]] = {k: [] for k in backends}
    for r in range(args.rounds):
        batch = synthetic_batch(args.groups, args.n, args.tokens, seed=r)
        for name, lrn in learners.items():
            times[name].append(lrn.train_batch(batch, RELEASED_BASE_WEIGHTS))
    publish = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, lrn in learners.items():
            _, seconds = lrn.publish(tmp, version=1)
            publish[name] = seconds
    load_after = os.getloadavg()[0]
    rows = []
    for name, runs in times.items():
        best = min(runs, key=lambda m: m["seconds"])
        rows.append({"backend": name, "init_s": learners[name].init_s, "step_s": best["seconds"], "samples_per_s": best["samples_per_s"],
                     "tokens_per_s": best["tokens_per_s"], "publish_s": publish[name], "all_step_s": [m["seconds"] for m in runs]})
    report = {"benchmark": "learner_throughput", "model": args.model, "batch": {"groups": args.groups, "n": args.n, "tokens": args.tokens, "micro": args.micro},
              "results": rows, "peak_rss_gb_all_backends": rss_gb(), "machine": {"cpus": os.cpu_count()},
              "outside_load_1min": {"before": load_before, "after": load_after}}
    print(f"{'backend':<8}{'step s':>9}{'samples/s':>11}{'tokens/s':>10}{'publish s':>11}")
    for r in rows:
        print(f"{r['backend']:<8}{r['step_s']:>9.2f}{r['samples_per_s']:>11.2f}{r['tokens_per_s']:>10.0f}{r['publish_s']:>11.2f}")
    print(f"batch: {args.groups} groups x {args.n} x {args.tokens} tokens (half generated); tokens/s counts generated tokens")
    print(f"peak RSS (three learners in one process): {report['peak_rss_gb_all_backends']:.1f} GB; outside load {load_before:.2f} -> {load_after:.2f}")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
