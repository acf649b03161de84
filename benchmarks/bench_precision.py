"""fp32 vs bf16 side by side: generator tokens/s, learner tokens/s and one synchronous step.

Same model, same prompts, same cores, one run, so the ratios hold under the
outside load the report records. For each dtype: a vLLM CPU generator
(actors/generation/vllm_engine.py) and a torch learner (learner/engine.py; bf16 =
autocast over fp32 master weights) in this process.

- generator: --sequences random-token prompts of --prompt-tokens, --new-tokens
  each at temperature 1 (the rollout setting), generated tokens per second;
- learner: one train_batch on --sequences sequences of --prompt-tokens +
  --new-tokens (the generated part scored), sequence tokens per second;
- step, toy-shaped (short prompt) and BFCL-shaped (a ~1.6K-token prompt, the
  BFCL multi-turn prompts' size) groups: generate a group, train on it, send
  the weights to the generator in its dtype; seconds, and the step's mismatch
  metric (mean |log mu - log pi_old| over tokens generated at the learner's
  weights: the vLLM vs learner gap, learner/step_stats.py).

The generators run one after another (one vLLM engine per process at a
time); the learners are both alive and alternate.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from actors.generation.vllm_engine import VllmGenerator
from benchmarks._common import figure, log, save_figure, summary, table
from env_pool import tags as T
from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from replay.messages import Segment, Trajectory
from rollout.generator import GenerationRequest, SamplingConfig
from weights.precision import BF16_CPU_FLAGS, read_cpu_flags, resolve_dtype

NAME = "precision"
DTYPES = ("float32", "bfloat16")
SHAPES = {"toy": (160, 32), "bfcl": (1600, 64)}  # (prompt tokens, new tokens) of a step's group


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="embedded", help="embedded, tiny or a model directory")
    parser.add_argument("--sequences", type=int, default=4, help="sequences per generate call / learner batch / group")
    parser.add_argument(
        "--prompt-tokens", type=int, default=512, help="prompt length of the generator and learner measurements"
    )
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence")
    parser.add_argument("--shapes", default="toy,bfcl", help=f"step shapes, comma-separated: {', '.join(SHAPES)}")


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200, 40000) for _ in range(length)] for _ in range(n)]


def _trajectories(outputs, prompts, group: str) -> list:
    out = []
    for i, (o, p) in enumerate(zip(outputs, prompts)):
        ids = list(p) + list(o.token_ids)
        reward = float(i % 2)  # mixed rewards: every group has an advantage to follow
        out.append(
            Trajectory(
                task_id=group,
                category="base",
                env="bench",
                group_id=group,
                rollout_index=i,
                interface_version=0,
                token_ids=ids,
                loss_mask=[0] * len(p) + [1] * len(o.token_ids),
                logprobs=[0.0] * len(p) + list(o.logprobs),
                prompt_length=len(p),
                segments=[Segment(len(p), len(ids), o.policy_version)],
                reward=reward,
                success=bool(reward),
                progress=reward,
                tags=[T.PASS if reward else T.STATE_MISMATCH],
                labels=[],
                error_type=None,
                outcome="completed",
                num_tool_calls=0,
                num_steps=1,
            )
        )
    return out


def _learner(model: str, dtype: str, n: int):
    cfg = LearnerConfig(
        backend="torch", dtype=dtype, mini_batch_groups=1, micro_batch_size=1, loss=LossConfig(kl_coef=0.0), lr=1e-6
    )  # no reference model: the policy's cost alone
    return Learner(model, cfg, group_size=n, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


def _generate(gen, prompts, new_tokens: int, seed: int):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens, seed=seed)
    reqs = [GenerationRequest(f"r{seed}-{i}", p, new_tokens, seed=seed + i) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    outs = gen.generate(reqs, sampling)
    return outs, time.perf_counter() - t0


def _measure_dtype(args, dtype: str, learner, seed0: int) -> dict[str, Any]:
    n = args.sequences
    gen = VllmGenerator(args.model, dtype=dtype, max_model_len=4096, cpu_kv_cache_gb=1)
    try:
        gen.reset_prefix_cache()
        _generate(gen, _prompts(n, 64, seed0), 8, seed0)  # warm-up: first-call allocations
        gen_tps, learn_tps, batch = [], [], None
        for r in range(args.repeats):
            gen.reset_prefix_cache()  # every repeat prefills in full
            prompts = _prompts(n, args.prompt_tokens, seed0 + 1 + r)
            outs, sec = _generate(gen, prompts, args.new_tokens, seed0 + 100 * r)
            gen_tps.append(sum(len(o.token_ids) for o in outs) / sec)
            batch = _trajectories(outs, prompts, f"g{r}")
            res = learner.train_batch(batch, RELEASED_BASE_WEIGHTS, policy_version=None)
            learn_tps.append(res.sequence_tokens / res.seconds)
            log(
                f"[{NAME}] {dtype} repeat {r + 1}: generator {gen_tps[-1]:.1f} tokens/s, learner {learn_tps[-1]:.1f} tokens/s"
            )
        # The learner moved during the measurements above: the generator takes its weights, so the
        # steps' mismatch compares vLLM and the learner at the same weights.
        gen.update_weights(gen.policy_version + 1, learner.weights_out.generator_weights(gen.dtype))
        steps = {}
        for shape in args.shape_list:
            prompt_len, new = SHAPES[shape]
            rows = []
            for r in range(args.repeats):
                prompts = [_prompts(1, prompt_len, seed0 + 500 + r)[0]] * n  # one task per group, like rollouts
                version = gen.policy_version
                t0 = time.perf_counter()
                outs, gen_s = _generate(gen, prompts, new, seed0 + 700 + r)
                res = learner.train_batch(
                    _trajectories(outs, prompts, f"{shape}{r}"), RELEASED_BASE_WEIGHTS, policy_version=version
                )
                t1 = time.perf_counter()
                update_s = gen.update_weights(version + 1, learner.weights_out.generator_weights(gen.dtype))
                rows.append(
                    {
                        "step_s": time.perf_counter() - t0,
                        "generate_s": gen_s,
                        "learn_s": res.seconds,
                        "weights_s": time.perf_counter() - t1,
                        "engine_load_s": update_s,
                        "mismatch_abs_logprob_diff": res.mismatch_abs_logprob_diff,
                        "mismatch_kl": res.mismatch_kl,
                    }
                )
                log(
                    f"[{NAME}] {dtype} {shape} step {r + 1}: {rows[-1]['step_s']:.1f} s, |d logp| {res.mismatch_abs_logprob_diff:.2e}"
                )
            steps[shape] = {k: summary([row[k] for row in rows]) for k in rows[0]}
        return {
            "generator_tokens_per_s": summary(gen_tps),
            "learner_tokens_per_s": summary(learn_tps),
            "steps": steps,
            "generator_dtype": gen.dtype,
            "learner_dtype": learner.dtype,
        }
    finally:
        gen.close()


def run(args) -> dict[str, Any]:
    args.shape_list = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in args.shape_list if s not in SHAPES]
    if bad or args.sequences < 2:
        raise ValueError(
            f"--shapes takes {', '.join(SHAPES)} (got {bad}); --sequences must be >= 2 (a group needs two)"
        )
    learners = {d: _learner(args.model, d, args.sequences) for d in DTYPES}
    per = {}
    for d in DTYPES:
        log(f"[{NAME}] {d}: generator, learner and steps")
        per[d] = _measure_dtype(args, d, learners[d], seed0=1)
    med = lambda d, k: per[d][k]["median"]
    auto, why = resolve_dtype("auto", "cpu")
    report = {
        "model": args.model,
        "sequences": args.sequences,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "dtype_auto": auto,
        "dtype_auto_reason": why,
        "cpu_bf16_flags": sorted(read_cpu_flags() & set(BF16_CPU_FLAGS)),
        "per_dtype": per,
        "generator_speedup": med("bfloat16", "generator_tokens_per_s") / med("float32", "generator_tokens_per_s"),
        "learner_speedup": med("bfloat16", "learner_tokens_per_s") / med("float32", "learner_tokens_per_s"),
        "step_speedup": {
            s: per["float32"]["steps"][s]["step_s"]["median"] / per["bfloat16"]["steps"][s]["step_s"]["median"]
            for s in args.shape_list
        },
        "notes": [
            "learner: torch backend, bf16 = torch CPU autocast (fp32 master weights and AdamW state), no KL reference",
            "step: generate one group (one prompt x --sequences), train_batch on it, weights to vLLM in its dtype; "
            "no env in the loop (the env's cost is the same in both dtypes)",
            "mismatch_abs_logprob_diff: the learner's step metric, vLLM's logprobs vs the learner's at the same weights",
        ],
    }
    return report


def render(report: dict[str, Any]) -> str:
    per = report["per_dtype"]
    rows = [
        (
            d,
            per[d]["generator_tokens_per_s"]["median"],
            per[d]["learner_tokens_per_s"]["median"],
            *[per[d]["steps"][s]["step_s"]["median"] for s in report["step_speedup"]],
            *[f"{per[d]['steps'][s]['mismatch_abs_logprob_diff']['median']:.2e}" for s in report["step_speedup"]],
        )
        for d in per
    ]
    rows.append(
        (
            "bf16/fp32 speedup",
            report["generator_speedup"],
            report["learner_speedup"],
            *report["step_speedup"].values(),
            *[None] * len(report["step_speedup"]),
        )
    )
    shapes = list(report["step_speedup"])
    head = ["dtype", "gen tok/s", "learner tok/s", *[f"{s} step s" for s in shapes], *[f"{s} |dlogp|" for s in shapes]]
    return table(rows, head) + f"\nauto here: {report['dtype_auto']} ({report['dtype_auto_reason']})"


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax,) = figure(1)
    names = ["generator", "learner", *[f"{s} step" for s in report["step_speedup"]]]
    values = [report["generator_speedup"], report["learner_speedup"], *report["step_speedup"].values()]
    ax.bar(names, values)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("bf16 speedup over fp32")
    return save_figure(fig, out_dir, NAME, f"bf16 vs fp32, {report['model']}")
