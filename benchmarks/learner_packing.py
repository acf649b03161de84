"""Shared-prefix packing vs one trajectory per forward: the learner step on BFCL-shaped groups.

A GRPO group's n rollouts share their opening prompt (BFCL: ~6K tokens of a
~6.5K-token trajectory). Unpacked (micro_batch_size 1) the learner forwards
that prompt n times, for the policy and again for the reference model;
packed (learner.cfg.shared_prefix, micro_batch_size n) once per group
(learner/packing.py). Each (mode, round) runs in its own spawned process so
peak memory (VmHWM) is per mode; the modes alternate every round so both
see the same outside load. Synthetic token ids (compute does not depend on
them): a prompt, then generated spans alternating with tool-result spans.
Prints a table and writes JSON (default benchmarks/results/learner_packing.json).

    .venv/bin/python benchmarks/learner_packing.py [--prompt 6000] [--continuation 600] [--n 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import time

from _report import write_report
from learner_throughput import rss_gb


def bfcl_shaped_batch(groups: int, n: int, prompt: int, continuation: int, seed: int):
    from env_pool import tags as T
    from replay.messages import Segment, Trajectory

    rng = random.Random(seed)
    out = []
    for g in range(groups):
        opening = [rng.randrange(100, 40000) for _ in range(prompt)]
        for i in range(n):
            ids, mask, logprobs, segments = list(opening), [0] * prompt, [0.0] * prompt, []
            gen = True
            while len(ids) < prompt + continuation:
                span = min(prompt + continuation - len(ids), rng.randint(40, 160))
                if gen:
                    segments.append(Segment(len(ids), len(ids) + span, 0))
                ids += [rng.randrange(100, 40000) for _ in range(span)]
                mask += [int(gen)] * span
                logprobs += [-rng.uniform(0.1, 5.0) if gen else 0.0 for _ in range(span)]
                gen = not gen
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
                    segments=segments,
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


def one_step(model: str, packed: bool, args, seed: int, conn) -> None:
    """Child process: build a ZeRO-2 learner (the CPU default's), one step, report."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from env_pool.tags import RELEASED_BASE_WEIGHTS
    from learner.engine import Learner, LearnerConfig
    from weights.model_assets import resolve_model

    cfg = LearnerConfig(
        backend="deepspeed",
        zero_stage=2,
        lr=1e-6,
        mini_batch_groups=args.groups,
        micro_batch_size=args.n if packed else 1,
        gradient_checkpointing=True,
        shared_prefix=packed,
    )
    lrn = Learner(
        str(resolve_model(model)), cfg, group_size=args.n, world_size=1, timeout_s=600.0, step_timeout_s=3600.0
    )
    batch = bfcl_shaped_batch(args.groups, args.n, args.prompt, args.continuation, seed)
    t = time.perf_counter()
    m = lrn.train_batch(batch, RELEASED_BASE_WEIGHTS)
    conn.send(
        {
            "step_s": time.perf_counter() - t,
            "loss": m.loss,
            "forward_tokens": m.forward_tokens,
            "sequence_tokens": m.sequence_tokens,
            "peak_rss_gb": rss_gb(),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=6000, help="shared opening-prompt tokens per group")
    parser.add_argument(
        "--continuation", type=int, default=600, help="tokens after the prompt per rollout (generated + tool results)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/learner_packing.json")
    args = parser.parse_args()
    if args.n < 2:
        raise SystemExit("--n must be >= 2: packing shares a prompt between rollouts")

    ctx = mp.get_context("spawn")
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"unpacked": [], "packed": []}
    for r in range(args.rounds):
        for mode in ("unpacked", "packed") if r % 2 == 0 else ("packed", "unpacked"):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=one_step, args=(args.model, mode == "packed", args, r, child))
            proc.start()
            result = parent.recv()
            proc.join()
            runs[mode].append(result)
            print(
                f"round {r + 1}/{args.rounds} {mode}: {result['step_s']:.1f} s, peak {result['peak_rss_gb']:.1f} GB",
                flush=True,
            )
    ratios = [u["step_s"] / p["step_s"] for u, p in zip(runs["unpacked"], runs["packed"])]
    loss_gap = max(
        abs(u["loss"] - p["loss"]) / max(abs(u["loss"]), 1e-12) for u, p in zip(runs["unpacked"], runs["packed"])
    )
    report = {
        "benchmark": "learner_packing",
        "model": args.model,
        "learner": "deepspeed-zero2, gradient checkpointing",
        "batch": {"groups": args.groups, "n": args.n, "prompt": args.prompt, "continuation": args.continuation},
        **{
            mode: {
                "step_s_median": statistics.median(x["step_s"] for x in rs),
                "step_s": [x["step_s"] for x in rs],
                "forward_tokens": rs[0]["forward_tokens"],
                "peak_rss_gb": max(x["peak_rss_gb"] for x in rs),
            }
            for mode, rs in runs.items()
        },
        "speedup_median": statistics.median(ratios),
        "speedup": ratios,
        "max_relative_loss_gap": loss_gap,
        "outside_load": {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "cpus": os.cpu_count(),
    }
    print(f"{'mode':<10}{'step s':>9}{'forward tokens':>16}{'peak GB':>9}")
    for mode in runs:
        print(
            f"{mode:<10}{report[mode]['step_s_median']:>9.1f}{report[mode]['forward_tokens']:>16}{report[mode]['peak_rss_gb']:>9.1f}"
        )
    print(
        f"packed speedup {report['speedup_median']:.2f}x (per round {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"loss gap {loss_gap:.1e}; load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
