"""The KL reference's log-probabilities from the generator against the learner's own reference forward.

Under LoRA the reference is the base model (the policy with its adapter off, learner/lora.py), and
the generator serves that base already: vLLM's prompt log-probabilities of a finished trajectory,
asked without an adapter, could stand in for the learner's reference forward (the stage each
learner step waits for). This part measures whether they may: on the main job's shape (the env's
first --tasks training prompts, one completion each from the generator at the run's temperature
and max_new_tokens, as rollouts are made) it computes

- the generator's reference: ``VllmGenerator.prompt_logprobs`` of prompt + completion, the base
  served with LoRA slots and no adapter (what a replica would answer);
- the learner's reference: a LoRA learner (rank --rank, the run's dtype) forwarding the same tokens
  through ``Learner.ref`` (adapter off) under its autocast, log-softmax of the logits;
- the behaviour gap the off-policy metrics already carry: |sampled log-prob - the learner's policy
  log-prob| on the same tokens (at step 0 the adapter's B is 0, so the policy is the base), the
  run's ``mismatch_abs_logprob_diff``;

per completion token: mean, 99th percentile and largest |difference|, and the KL estimate (k3) the
generator's reference would give where the learner's gives exactly 0 (policy = reference at step
0). And the seconds each side takes for all sequences, one after the other on the same cores.
The verdict: within tolerance when the reference gap's mean is at most the behaviour gap's.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from actors.generation.adapters import VLLM_LORA_RANKS
from actors.generation.vllm_engine import VllmGenerator
from benchmarks._common import figure, log, save_figure, table
from learner.engine import Learner, LearnerConfig
from learner.lora import LoraConfig
from learner.loss import LossConfig
from rollout.chat import ChatTokenizer
from rollout.generator import GenerationRequest, SamplingConfig
from seal.config import compose, instantiate
from weights.model_assets import load_tokenizer, resolve_model

NAME = "reference"
KEYS = ("mean", "p99", "max")


def add_arguments(parser) -> None:
    parser.add_argument("--tasks", type=int, default=6, help="training prompts, one completion each")
    parser.add_argument("--rank", type=int, default=8, help="the LoRA learner's adapter rank")


def _sequences(cfg, tasks: int) -> tuple[list[list[int]], str]:
    env, interface = instantiate(cfg.env), instantiate(cfg.interface)
    model = str(resolve_model(str(cfg.model.path)))
    chat = ChatTokenizer(load_tokenizer(model))
    prompts = [
        chat.encode(chat.render(env.reset(task, interface), generation_prompt=True))
        for task in env.task_ids(cfg.split)[:tasks]
    ]
    return prompts, model


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _gap(a: list[float], b: list[float]) -> dict[str, float]:
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return {"mean": statistics.fmean(diffs), "p99": _quantile(diffs, 0.99), "max": max(diffs)}


def _generator_side(model: str, dtype: str, rank: int, prompts, sampling) -> dict[str, Any]:
    slot = min(r for r in VLLM_LORA_RANKS if r >= rank)  # served as a LoRA run serves: slots, no adapter
    gen = VllmGenerator(model, dtype=dtype, max_model_len=4096, cpu_kv_cache_gb=1, max_lora_rank=slot)
    try:
        reqs = [GenerationRequest(f"ref-{i}", p, sampling.max_new_tokens, seed=i) for i, p in enumerate(prompts)]
        outs = gen.generate(reqs, sampling)
        sequences = [list(p) + list(o.token_ids) for p, o in zip(prompts, outs)]
        gen.prompt_logprobs(sequences[0])  # warm-up: first-call allocations
        gen.reset_prefix_cache()  # a trajectory's tokens were just generated, but prompt logprobs prefill it whole
        t0 = time.perf_counter()
        ref = [gen.prompt_logprobs(s)[len(p) - 1 :] for s, p in zip(sequences, prompts)]
        seconds = time.perf_counter() - t0
        return {
            "sequences": sequences,
            "behaviour": [list(o.logprobs) for o in outs],
            "reference": ref,
            "seconds": seconds,
            "dtype": gen.dtype,
        }
    finally:
        gen.close()


def _learner_side(model: str, dtype: str, rank: int, prompts, sequences) -> dict[str, Any]:
    import torch

    cfg = LearnerConfig(
        backend="torch",
        dtype=dtype,
        mini_batch_groups=1,
        micro_batch_size=1,
        loss=LossConfig(kl_coef=0.001),
        lora=LoraConfig(rank=rank),
    )
    lrn = Learner(model, cfg, group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)

    def logprobs(forward, ids: list[int], start: int) -> list[float]:
        t = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad(), lrn._autocast():
            logits = forward(input_ids=t).logits[0].float()
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, t[0, 1:].unsqueeze(1)).squeeze(1)
        return lp[start - 1 :].tolist()

    logprobs(lrn.ref, sequences[0], len(prompts[0]))  # warm-up
    t0 = time.perf_counter()
    ref = [logprobs(lrn.ref, s, len(p)) for s, p in zip(sequences, prompts)]
    seconds = time.perf_counter() - t0
    policy = [logprobs(lrn.model, s, len(p)) for s, p in zip(sequences, prompts)]  # B = 0: the base
    return {"reference": ref, "policy": policy, "seconds": seconds, "dtype": lrn.dtype}


def run(args) -> dict[str, Any]:
    cfg = compose(list(args.overrides))
    prompts, model = _sequences(cfg, args.tasks)
    sampling = SamplingConfig(
        temperature=float(cfg.sampling.temperature), max_new_tokens=int(cfg.sampling.max_new_tokens)
    )
    log(f"[{NAME}] {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {model}")
    gen = _generator_side(model, str(cfg.generator.dtype), args.rank, prompts, sampling)
    lrn = _learner_side(model, str(cfg.learner.cfg.dtype), args.rank, prompts, gen["sequences"])
    flat = lambda rows: [x for row in rows for x in row]  # per completion token, all sequences
    ref_gen, ref_lrn = flat(gen["reference"]), flat(lrn["reference"])
    behaviour, policy = flat(gen["behaviour"]), flat(lrn["policy"])
    reference_gap, behaviour_gap = _gap(ref_gen, ref_lrn), _gap(behaviour, policy)
    k3 = statistics.fmean(math.exp(g - p) - (g - p) - 1 for g, p in zip(ref_gen, policy))
    tokens = sum(len(s) for s in gen["sequences"])
    report = {
        "model": model,
        "generator_dtype": gen["dtype"],
        "learner_dtype": lrn["dtype"],
        "sequences": len(prompts),
        "sequence_tokens": tokens,
        "completion_tokens": len(ref_gen),
        "reference_gap": reference_gap,
        "behaviour_gap": behaviour_gap,
        "k3_with_generator_reference_at_step0": k3,
        "generator_reference_s": gen["seconds"],
        "learner_reference_s": lrn["seconds"],
        "within_tolerance": reference_gap["mean"] <= behaviour_gap["mean"],
    }
    report["targets"] = [
        {
            "name": "reference gap within the behaviour gap",
            "target": f"mean <= {behaviour_gap['mean']:.4f}",
            "measured": reference_gap["mean"],
            "met": report["within_tolerance"],
        }
    ]
    return report


def render(report: dict[str, Any]) -> str:
    rows = [
        ["generator reference vs learner reference", *(f"{report['reference_gap'][k]:.4f}" for k in KEYS)],
        ["behaviour vs learner policy (off-policy metric)", *(f"{report['behaviour_gap'][k]:.4f}" for k in KEYS)],
    ]
    head = (
        f"{report['sequences']} sequences, {report['sequence_tokens']} tokens, {report['completion_tokens']} completion tokens; "
        f"generator {report['generator_dtype']}, learner {report['learner_dtype']}"
    )
    secs = (
        f"reference log-probs: generator {report['generator_reference_s']:.2f} s, "
        f"learner forward {report['learner_reference_s']:.2f} s (all sequences, one after the other)\n"
        f"k3 KL the generator's reference gives at step 0 (the learner's: 0): {report['k3_with_generator_reference_at_step0']:.2e}"
    )
    return head + "\n" + table(rows, ["|log-prob difference| per token", "mean", "p99", "max"]) + "\n" + secs


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, axes = figure()
    ax = axes[0] if isinstance(axes, list | tuple) else axes
    names = ["reference gap", "behaviour gap"]
    ax.bar(names, [report["reference_gap"]["mean"], report["behaviour_gap"]["mean"]])
    ax.set_ylabel("mean |log-prob difference| per token")
    title = f"reference from the generator ({report['generator_dtype']}) vs the learner ({report['learner_dtype']})"
    return save_figure(fig, out_dir, NAME, title)
