"""The learner group: the same global batch on 1 and 2 ranks (samples/s, communication share, peak memory per rank).

One LearnerGroup (seal/runtime/learner_group.py) per world size, built from the
composed learner config (learner=zero3 unless overridden) with its
world_size set; the batch is synthetic groups of --n rollouts in two shapes:
toy (short: --toy-tokens per trajectory) and BFCL-shaped (a long shared
prompt and a short response: --bfcl-tokens, 90% prompt). Per world size: the
step's wall seconds as the slowest rank reports it, samples/s, the share of
the step each rank spent inside DeepSpeed's collectives (its comms logger:
the time of each collective call; ZeRO-3's asynchronous gathers count as
issued, so the share is a lower bound), and the peak memory of each rank
(device memory under CUDA, the process's peak RSS on CPU). On a CPU machine
the ranks share its cores: no speedup is expected, the shape is the point.
"""

from __future__ import annotations

import functools
import random
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from benchmarks._common import figure, log, save_figure, summary, table
from benchmarks._pipeline import compose_cfg, ray_session
from env_pool import tags as T
from env_pool.tags import RELEASED_BASE_WEIGHTS
from replay.messages import Segment, Trajectory
from seal.config import LearnerGroupConfig, instantiate, instantiate_spec
from seal.runtime.learner_group import LearnerGroup

NAME = "learner-scale"


def add_arguments(parser) -> None:
    parser.add_argument("--world-sizes", default="1,2", help="learner ranks to compare, comma-separated")
    parser.add_argument("--groups", type=int, default=2, help="groups in the global batch (one optimizer step)")
    parser.add_argument("--n", type=int, default=2, help="rollouts per group")
    parser.add_argument("--toy-tokens", type=int, default=96, help="tokens per toy trajectory")
    parser.add_argument("--bfcl-tokens", type=int, default=1024, help="tokens per BFCL-shaped trajectory (90%% prompt)")
    parser.add_argument("--shapes", default="toy,bfcl", help="batch shapes: toy, bfcl")


def synthetic_batch(groups: int, n: int, tokens: int, prompt_share: float, seed: int):
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(100, 5000) for _ in range(int(tokens * prompt_share))]
        for i in range(n):
            gen = [rng.randrange(100, 5000) for _ in range(tokens - len(prompt) - rng.randrange(0, 8))]
            ids = prompt + gen
            mask = [0] * len(prompt) + [1] * len(gen)
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
                    logprobs=[-1.0 if m else 0.0 for m in mask],
                    prompt_length=len(prompt),
                    segments=[Segment(len(prompt), len(ids), 0)],
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


def _measure(cfg, world_size: int, batches: dict[str, list], repeats: int) -> dict[str, Any]:
    spec = OmegaConf.to_container(cfg.learner, resolve=True)
    spec["world_size"] = world_size
    cluster = instantiate(cfg.cluster)
    group = LearnerGroup(
        functools.partial(instantiate_spec, spec),
        LearnerGroupConfig.from_spec(spec),
        cluster.learner,
        env_vars=cluster.learner.env_vars(),
    )
    out: dict[str, Any] = {}
    try:
        for shape, batch in batches.items():
            group.train_now(batch, RELEASED_BASE_WEIGHTS)  # warm-up: first-step allocations, ZeRO-3 trace
            steps, shares = [], []
            for _ in range(repeats):
                group.comm_profile(True)
                t0 = time.perf_counter()
                result = group.train_now(batch, RELEASED_BASE_WEIGHTS)
                wall = time.perf_counter() - t0
                comm = group.comm_seconds()
                group.comm_profile(False)
                steps.append((result.seconds, len(batch) / result.seconds, wall))
                shares.append(sum(c / result.seconds for c in comm) / len(comm))
            step_s = summary([s[0] for s in steps])
            out[shape] = {
                "step_s": step_s,
                "samples_per_s": {**summary([s[1] for s in steps]), "median": len(batch) / step_s["median"]},
                "driver_wall_s": summary([s[2] for s in steps]),
                "comm_share": summary(shares),
            }
        out["peak_gb"] = group.peak_memory_gb()
    finally:
        group.close()
    return out


def run(args) -> dict[str, Any]:
    sizes = [int(x) for x in args.world_sizes.split(",") if x.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1 or not shapes or set(shapes) - {"toy", "bfcl"}:
        raise ValueError("--world-sizes needs sizes >= 1 and --shapes a subset of toy,bfcl")
    overrides = [
        "model=tiny",
        "learner=zero3",
        *args.overrides,
        f"n={args.n}",
        f"learner.cfg.mini_batch_groups={args.groups}",
        f"learner.cfg.micro_batch_size={args.n}",
    ]
    cfg = compose_cfg(overrides)
    shape_tokens = {"toy": (args.toy_tokens, 0.5), "bfcl": (args.bfcl_tokens, 0.9)}
    batches = {s: synthetic_batch(args.groups, args.n, *shape_tokens[s], seed=i) for i, s in enumerate(shapes)}
    per_size = {}
    with ray_session(cfg):
        for ws in sizes:
            log(f"[{NAME}] world_size={ws}: starting {ws} learner ranks")
            per_size[ws] = _measure(cfg, ws, batches, args.repeats)
    first = shapes[0]
    return {
        "world_size": sizes,
        "shape": first,
        "samples_per_s": [per_size[w][first]["samples_per_s"]["median"] for w in sizes],
        "comm_share": [per_size[w][first]["comm_share"]["median"] for w in sizes],
        "peak_gb_per_rank": [max(per_size[w]["peak_gb"]) for w in sizes],
        "peak_gb_by_rank": {str(w): per_size[w]["peak_gb"] for w in sizes},
        "shapes": {
            s: {
                "samples_per_s": [per_size[w][s]["samples_per_s"]["median"] for w in sizes],
                "step_s": [per_size[w][s]["step_s"]["median"] for w in sizes],
                "comm_share": [per_size[w][s]["comm_share"]["median"] for w in sizes],
                "tokens_per_trajectory": shape_tokens[s][0],
            }
            for s in shapes
        },
        "global_batch": {"groups": args.groups, "n": args.n},
        "learner": f"{cfg.learner.cfg.backend} stage {cfg.learner.cfg.zero_stage}, model {cfg.model.path}",
        "notes": [
            "samples_per_s: trajectories of the global batch over the median step seconds (the slowest rank's)",
            "comm_share: mean over ranks of seconds inside DeepSpeed collectives (comms logger) / step seconds; "
            "a blocking collective also counts the wait for the slower peer",
            "peak_gb_per_rank: the largest rank's peak (CUDA: max_memory_allocated; CPU: process VmHWM, which "
            "includes the Python runtime and libraries)",
        ],
    }


def render(report: dict[str, Any]) -> str:
    rows = []
    for s, fig in report["shapes"].items():
        for i, w in enumerate(report["world_size"]):
            rows.append(
                (
                    s,
                    w,
                    fig["samples_per_s"][i],
                    fig["step_s"][i],
                    fig["comm_share"][i],
                    report["peak_gb_by_rank"][str(w)] and max(report["peak_gb_by_rank"][str(w)]),
                )
            )
    return table(rows, ["shape", "ranks", "samples/s", "step s", "comm share", "peak GB/rank"])


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax, bx) = figure(2)
    for s, f in report["shapes"].items():
        ax.plot(report["world_size"], f["samples_per_s"], marker="o", label=s)
        bx.plot(report["world_size"], f["comm_share"], marker="o", label=s)
    ax.set_xlabel("learner ranks")
    ax.set_ylabel("samples/s")
    bx.set_xlabel("learner ranks")
    bx.set_ylabel("communication share of the step")
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, NAME, "learner group: same global batch on 1 and 2 ranks")
