"""One learner, one shape, in a process of its own: `seal bench learner` runs this for each system.

    python benchmarks/learner_probe.py SPEC_JSON

SPEC: {"repo": a checkout (this one, or another commit's worktree for the baseline), "overrides":
hydra overrides, "batch": the trajectories as dicts, "warmup", "steps", "threads", "publish_dtype",
"carry_reference": a LoRA learner's trajectories carry the KL reference (filled here, untimed)}.
The learner is built from that checkout's own config and code, so an older commit is measured as it
was. Prints one line `PROBE {json}`: per measured step the learner's own seconds and tokens/s, the
phases where the checkout's learner has a phase clock (learner/phases.py), the publish time (the
weights leaving the learner as the object-store path takes them), the process's peak RSS, and the
bf16 matmul peak of these threads measured in this process after the steps.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def matmul_peak(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of a size^3 bf16 matmul on ``threads`` torch threads (2 size^3 flops each)."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size).to(torch.bfloat16)
    b = torch.randn(size, size).to(torch.bfloat16)
    torch.matmul(a, b)  # warm-up: oneDNN picks and caches its kernel
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def with_base_reference(learner, traj):
    """``traj`` carrying the base model's log-prob of each generated token (a LoRA learner's policy
    with its adapter off, under its autocast), as a replica's reply would make it."""
    from dataclasses import replace

    with learner.model.disable_adapter():
        lps = learner.canary_logprobs(traj.token_ids)
    ref = [0.0] + [lp if m else 0.0 for m, lp in zip(traj.loss_mask[1:], lps)]
    return replace(traj, reference_logprobs=ref)


def main(spec: dict) -> dict:
    sys.path.insert(0, spec["repo"])
    os.chdir(spec["repo"])
    import torch

    torch.set_num_threads(spec["threads"])
    from env_pool.tags import RELEASED_BASE_WEIGHTS
    from replay.messages import Segment, Trajectory
    from seal.config import compose, instantiate

    cfg = compose(spec["overrides"])
    learner = instantiate(cfg.learner)
    import ray  # publishing puts the weights into Ray's object store, as the pipeline's learner does

    # Its own instance (address="local"): never a cluster RAY_ADDRESS names.
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    batch = []
    for t in spec["batch"]:
        t = dict(t)
        t["segments"] = [Segment(*s) for s in t["segments"]]
        batch.append(Trajectory(**t))
    if spec.get("carry_reference"):  # trainer.reference_logprobs=generator: the base's log-probs ride along
        batch = [with_base_reference(learner, t) for t in batch]
    clock = None
    if hasattr(learner, "phases"):
        from learner.phases import PhaseClock

        clock = learner.phases = PhaseClock()
    steps = []
    for k in range(spec["warmup"] + spec["steps"]):
        if clock:
            clock.take()
        out = learner.train_batch(batch, RELEASED_BASE_WEIGHTS, policy_version=k)
        if k >= spec["warmup"]:
            row = {
                "seconds": out.seconds,
                "tokens_per_s": out.tokens_per_s,
                "samples_per_s": out.samples_per_s,
            }
            row.update(scored_tokens=out.scored_tokens, forward_tokens=out.forward_tokens, loss=out.loss)
            if clock:
                row["phases"] = clock.take()
            t0 = time.perf_counter()
            manifest = learner.weights_out.weight_manifest(spec["publish_dtype"])
            row["publish_s"] = time.perf_counter() - t0
            row["publish_bytes"] = getattr(manifest, "total_bytes", 0)  # the object-store bytes a publish puts
            del manifest
            steps.append(row)
    if spec.get("profile"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            learner.train_batch(batch, RELEASED_BASE_WEIGHTS, policy_version=k + 1)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=spec["profile"]), file=sys.stderr)
    ray.shutdown()
    return {
        "steps": steps,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "peak_flops_per_s": matmul_peak(spec["threads"]),
        "learner_dtype": getattr(learner, "dtype", None),
        "torch_threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    result = main(json.loads(open(sys.argv[1]).read()))
    print("PROBE " + json.dumps(result), flush=True)
