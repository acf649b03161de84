"""One learner step broken into phases, its FLOP/s against the processor's bf16 matmul peak.

Two shapes: `main` (the main job's: one packed shopping group of n=6 from the default config, the
env's real opening prompt rendered by our chat template, synthetic continuations of two generated
spans around a tool result) and `trl` (`seal bench trl`'s: the toy env's prompt, a group of 8, 128
generated tokens). Each (system, shape, repeat) runs in a process of its own
(benchmarks/learner_probe.py: the learner built from that checkout's config, warm-up steps, then
measured ones), so peak RSS is per system; with --baseline DIR (a checkout of another commit, e.g.
`git worktree add /tmp/old c76e32f`) the two systems alternate, the order flipping every repeat.
With --lora R the systems are this checkout training every weight (`full`), a rank-R LoRA adapter
(`lora`: learner.cfg.lora.rank=R, publishes carry the adapter alone) and that adapter with the KL
reference carried by the trajectories (`lora_genref`: trainer.reference_logprobs=generator, the
learner skipping its reference forward; the probe fills them with the base model's log-probs before
the timed steps, which the replicas' agree with within the bf16 mismatch: `seal bench reference`),
on the same shapes.

FLOPs are the step's useful work, counted from the model's config and the batch's layout: every
linear layer of the policy forward and backward (3x the forward) at every forwarded token, the
attention each token does over the context it has (packed: the prefix once, each continuation
against the prefix and itself), the output head at the scored tokens only, and the KL reference's
forward. Recomputation (gradient checkpointing, the chunked head's backward) is not useful work
and is not counted. Under LoRA the frozen base needs no weight gradients: its backward is the input
gradients alone (1x the forward; the adapter's own rank-R matmuls are not counted). `peak_fraction` = FLOP/s / the bf16 matmul peak the probe measures on the
same threads in the same process (2048^3 `torch.matmul`, best of 5).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from benchmarks._common import REPO, figure, log, save_figure, summary, table, target
from env_pool import tags as T
from learner.packing import common_prefix_length
from rollout.chat import ChatTokenizer
from seal.config import compose, instantiate
from weights.model_assets import load_tokenizer, resolve_model

NAME = "learner"
SHAPES = {
    # The default config's micro-batch: shopping, one packed group of n=6 (the default trains two a step,
    # each its own micro-batch; one keeps the figures comparable with earlier measurements).
    "main": ["trainer.groups_per_step=1"],
    "trl": ["env=toy", "n=8", "sampling.max_new_tokens=128", "trainer.groups_per_step=1"],  # seal bench trl's shape
}
PHASE_ORDER = (
    "collate",
    "policy_forward",
    "logprobs",
    "reference_forward",
    "loss",
    "backward",
    "optimizer",
    "zero_bookkeeping",
)


GENREF = "lora_genref"  # --lora's third system: the KL reference carried by the trajectories


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=3, help="measured learner steps per process")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and not measured (>= 1)")
    parser.add_argument("--shapes", default="main,trl", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of the learner")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, measured alternately")
    parser.add_argument(
        "--lora", type=int, default=None, metavar="RANK", help="full training against a rank-RANK LoRA adapter"
    )


def _shape_batch(shape: str, overrides: list[str], seed: int) -> tuple[list[dict], Any]:
    """One group of the shape's config: the env's first training prompt, n synthetic rollouts."""
    cfg = compose([*SHAPES[shape], *overrides])
    env, interface = instantiate(cfg.env), instantiate(cfg.interface)
    chat = ChatTokenizer(load_tokenizer(str(cfg.model.path)))
    task = env.task_ids(cfg.split)[0]
    prompt = chat.encode(chat.render(env.reset(task, interface), generation_prompt=True))
    rng = random.Random(seed)
    new_tokens = int(cfg.sampling.max_new_tokens) if shape == "trl" else 0
    out = []
    for i in range(int(cfg.n)):
        if new_tokens:  # one completion of max_new_tokens, as TRL's run makes them
            spans = [("gen", new_tokens)]
        else:  # a tool call, its result, an answer: ~150 generated tokens, as the main job's episodes
            spans = [("gen", rng.randint(45, 85)), ("tool", rng.randint(20, 40)), ("gen", rng.randint(45, 85))]
        ids, mask, logprobs, segments = list(prompt), [0] * len(prompt), [0.0] * len(prompt), []
        for kind, length in spans:
            start = len(ids)
            ids += [rng.randrange(100, 40000) for _ in range(length)]
            mask += [int(kind == "gen")] * length
            logprobs += [-rng.uniform(0.05, 4.0) if kind == "gen" else 0.0 for _ in range(length)]
            if kind == "gen":
                segments.append((start, len(ids), 0))
        reward = float(i % 2)
        out.append(
            {
                "task_id": task,
                "category": "base",
                "env": str(cfg.env._target_).rsplit(".", 1)[-1],
                "group_id": f"bench-{shape}",
                "rollout_index": i,
                "interface_version": 0,
                "token_ids": ids,
                "loss_mask": mask,
                "logprobs": logprobs,
                "prompt_length": len(prompt),
                "segments": segments,
                "reward": reward,
                "success": bool(reward),
                "progress": reward,
                "tags": [T.PASS if reward else T.EMPTY_TURN],
                "labels": [T.PASS],
                "error_type": None,
                "outcome": "completed",
                "num_tool_calls": 1,
                "num_steps": 2,
            }
        )
    return out, OmegaConf.to_container(cfg, resolve=True)


def step_flops(model_path: str, batch: list[dict], kl: bool, packed: bool, lora: bool = False) -> float:
    """Useful FLOPs of one learner step on ``batch`` (one group): see the module docstring."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(resolve_model(model_path)))
    d, layers, heads = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or d // heads
    kv = getattr(c, "num_key_value_heads", heads)
    per_token = (
        2 * layers * (d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d + 3 * d * c.intermediate_size)
    )
    seqs = [t["token_ids"] for t in batch]
    prefix = common_prefix_length(seqs) if packed and len(seqs) > 1 else 0
    conts = [len(s) - prefix for s in seqs]
    tokens = prefix + sum(conts)
    pairs = prefix * (prefix + 1) / 2 + sum(n * prefix + n * (n + 1) / 2 for n in conts)
    attention = layers * 4 * heads * head_dim * pairs  # QK^T and PV, 2 flops per multiply-add
    scored = sum(sum(t["loss_mask"][1:]) for t in batch)
    head = 2 * d * c.vocab_size * scored
    forward = per_token * tokens + attention + head
    return (2 if lora else 3) * forward + (forward if kl else 0.0)


def _probe(repo: Path, overrides: list[str], batch: list[dict], args, carry_reference: bool = False) -> dict[str, Any]:
    spec = {
        "carry_reference": carry_reference,
        "repo": str(repo),
        "overrides": overrides,
        "batch": batch,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads,
        "publish_dtype": "bfloat16",
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh)
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": str(args.threads)}
    try:
        proc = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "learner_probe.py"), fh.name],
            capture_output=True,
            text=True,
            env=env,
            timeout=3600,
        )
    finally:
        os.unlink(fh.name)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("PROBE ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"learner probe in {repo} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(line[len("PROBE ") :])


def _summarise(probes: list[dict], flops: float) -> dict[str, Any]:
    steps = [s for p in probes for s in p["steps"]]
    seconds = summary([s["seconds"] for s in steps])
    out = {
        "step_s": seconds,
        "tokens_per_s": summary([s["tokens_per_s"] for s in steps]),
        "samples_per_s": summary([s["samples_per_s"] for s in steps]),
        "publish_s": summary([s["publish_s"] for s in steps]),
        "publish_bytes": max(s.get("publish_bytes", 0) for s in steps),
        "flops_per_step": flops,
        "flops_per_s": flops / seconds["median"],
        "peak_flops_per_s": max(p["peak_flops_per_s"] for p in probes),
        "peak_rss_gb": max(p["peak_rss_gb"] for p in probes),
        "scored_tokens": steps[0]["scored_tokens"],
        "forward_tokens": steps[0]["forward_tokens"],
        "loss": summary([s["loss"] for s in steps]),
    }
    out["peak_fraction"] = out["flops_per_s"] / out["peak_flops_per_s"]
    if all("phases" in s for s in steps):
        names = [n for n in PHASE_ORDER if any(n in s["phases"] for s in steps)]
        phases = {n: summary([s["phases"].get(n, 0.0) for s in steps])["median"] for n in names}
        phases["other"] = max(0.0, seconds["median"] - sum(phases.values()))
        phases["publish"] = out["publish_s"]["median"]
        total = seconds["median"] + phases["publish"]
        out["phases"] = {n: {"seconds": v, "share": v / total} for n, v in phases.items()}
    return out


def run(args) -> dict[str, Any]:
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not shapes or set(shapes) - set(SHAPES):
        raise ValueError(f"--shapes must be a subset of {', '.join(SHAPES)}")
    if args.baseline is not None and not (args.baseline / "learner" / "engine.py").is_file():
        raise ValueError(f"--baseline {args.baseline} is not a checkout of this repository")
    if args.lora is not None and args.baseline is not None:
        raise ValueError("--lora compares two systems of this checkout: leave out --baseline")
    # name -> (checkout, its own overrides)
    systems: dict[str, tuple[Path, list[str]]] = {"this": (REPO, [])}
    if args.baseline:
        systems["baseline"] = (args.baseline.resolve(), [])
    if args.lora is not None:
        adapter = [f"learner.cfg.lora.rank={args.lora}"]
        systems = {"full": (REPO, []), "lora": (REPO, adapter), GENREF: (REPO, adapter)}
    first = next(iter(systems))
    per_shape: dict[str, Any] = {}
    for i, shape in enumerate(shapes):
        batch, cfg = _shape_batch(shape, list(args.overrides), seed=i)
        overrides = [*SHAPES[shape], *args.overrides]
        lc = cfg["learner"]["cfg"]
        model_path, kl, packed = str(cfg["model"]["path"]), bool(lc["loss"]["kl_coef"]), bool(lc["shared_prefix"])
        probes: dict[str, list[dict]] = {name: [] for name in systems}
        for r in range(args.repeats):
            order = list(systems) if r % 2 == 0 else list(reversed(systems))
            for name in order:
                log(f"[{NAME}] {shape}: {name} repeat {r + 1}/{args.repeats}")
                repo, own = systems[name]
                probes[name].append(_probe(repo, [*overrides, *own], batch, args, carry_reference=name == GENREF))
        per_shape[shape] = {
            name: _summarise(
                probes[name], step_flops(model_path, batch, kl and name != GENREF, packed, lora=name != "full")
            )
            for name in systems
        }
        per_shape[shape]["group"] = {
            "n": len(batch),
            "prompt_tokens": batch[0]["prompt_length"],
            "sequence_tokens": sum(len(t["token_ids"]) for t in batch),
        }
        if "baseline" in systems:
            this, base = per_shape[shape]["this"], per_shape[shape]["baseline"]
            per_shape[shape]["speedup"] = this["tokens_per_s"]["median"] / base["tokens_per_s"]["median"]
        if args.lora is not None:
            per_shape[shape]["lora_vs_full"] = lora_ratios(per_shape[shape]["full"], per_shape[shape]["lora"])
            per_shape[shape]["genref_vs_full"] = lora_ratios(per_shape[shape]["full"], per_shape[shape][GENREF])
    main = per_shape[shapes[0]][first]
    report: dict[str, Any] = {
        "shapes": per_shape,
        "shape": shapes[0],
        "phases": main.get("phases"),
        "tokens_per_s": main["tokens_per_s"]["median"],
        "flops_per_s": main["flops_per_s"],
        "peak_flops_per_s": main["peak_flops_per_s"],
        "peak_fraction": main["peak_fraction"],
        "baseline": str(args.baseline) if args.baseline else None,
        "lora_rank": args.lora,
        "threads": args.threads,
    }
    report["targets"] = [target(f"peak_fraction ({shapes[0]})", main["peak_fraction"], ">=", 0.5)]
    if args.baseline:
        report["targets"].append(
            target(f"tokens/s vs baseline ({shapes[0]})", per_shape[shapes[0]]["speedup"], ">=", 2.0)
        )
    if args.lora is not None:  # issue 49's targets, at the rank measured
        ratios = per_shape[shapes[0]]["lora_vs_full"]
        report["targets"] += [
            target(f"LoRA step speedup ({shapes[0]})", ratios["step_speedup"], ">=", 1.5),
            target(
                f"LoRA step speedup, reference from the generator ({shapes[0]})",
                per_shape[shapes[0]]["genref_vs_full"]["step_speedup"],
                ">=",
                1.5,
            ),
            target(f"LoRA / full peak RSS ({shapes[0]})", ratios["rss_ratio"], "<", 1.0),
            target(f"full / LoRA publish bytes ({shapes[0]})", ratios["publish_bytes_ratio"], ">=", 20.0),
            target(f"full / LoRA publish seconds ({shapes[0]})", ratios["publish_s_ratio"], ">=", 10.0),
        ]
    return report


def lora_ratios(full: dict[str, Any], lora: dict[str, Any]) -> dict[str, float]:
    """LoRA against full training on one shape: >1 means LoRA is faster or sends less, but
    ``rss_ratio`` (LoRA's peak RSS over full's: < 1 means LoRA holds less)."""
    return {
        "step_speedup": full["step_s"]["median"] / lora["step_s"]["median"],
        "rss_ratio": lora["peak_rss_gb"] / full["peak_rss_gb"],
        "publish_bytes_ratio": full["publish_bytes"] / max(lora["publish_bytes"], 1),
        "publish_s_ratio": full["publish_s"]["median"] / lora["publish_s"]["median"],
    }


def render(report: dict[str, Any]) -> str:
    parts = []
    for shape, per in report["shapes"].items():
        systems = [s for s in ("this", "baseline", "full", "lora", GENREF) if s in per]
        g = per["group"]
        parts.append(
            f"{shape}: one group of {g['n']}, prompt {g['prompt_tokens']} tokens, {g['sequence_tokens']} in all"
        )
        phased = [s for s in systems if per[s].get("phases")]
        if phased:
            names = list(dict.fromkeys(n for s in phased for n in per[s]["phases"]))
            rows = [(n, *(f"{per[s]['phases'].get(n, {}).get('seconds', 0.0):.3f}" for s in phased)) for n in names]
            parts.append(table(rows, ["phase", *(f"{s} s" for s in phased)]))
        rows = [
            (
                s,
                per[s]["step_s"]["median"],
                per[s]["tokens_per_s"]["median"],
                per[s]["flops_per_s"] / 1e9,
                per[s]["peak_flops_per_s"] / 1e9,
                f"{per[s]['peak_fraction']:.0%}",
                per[s]["peak_rss_gb"],
                per[s]["publish_bytes"] / 1e6,
                per[s]["publish_s"]["median"],
            )
            for s in systems
        ]
        header = ["system", "step s", "tokens/s", "GFLOP/s", "peak GFLOP/s", "of peak", "RSS GB", "publish MB"]
        parts.append(table(rows, [*header, "publish s"]))
        if "speedup" in per:
            parts.append(f"tokens/s, this / baseline: {per['speedup']:.2f}x")
        if "lora_vs_full" in per:
            r = per["lora_vs_full"]
            parts.append(
                f"LoRA vs full: step {r['step_speedup']:.2f}x faster, peak RSS x{r['rss_ratio']:.2f}, "
                f"publish {r['publish_bytes_ratio']:.1f}x fewer bytes, {r['publish_s_ratio']:.1f}x shorter"
            )
        if "genref_vs_full" in per:
            parts.append(
                f"LoRA with the generator's reference vs full: step {per['genref_vs_full']['step_speedup']:.2f}x faster"
            )
    return "\n\n".join(parts)


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    shapes = list(report["shapes"])
    fig, axes = figure(len(shapes))
    for ax, shape in zip(axes, shapes):
        per = report["shapes"][shape]
        systems = [s for s in ("this", "baseline", "full", "lora", GENREF) if s in per]
        for x, s in enumerate(systems):
            if not per[s].get("phases"):  # a checkout without the phase clock: its whole step, in grey
                ax.bar(x, per[s]["step_s"]["median"], color="0.6", label="whole step (no phase clock)")
                continue
            bottom = 0.0
            for name, p in per[s]["phases"].items():
                ax.bar(x, p["seconds"], bottom=bottom, label=name if x == 0 else None)
                bottom += p["seconds"]
        ax.set_xticks(range(len(systems)), systems)
        ax.set_ylabel("seconds per learner step")
        ax.set_title(shape, fontsize=9)
        ax.legend(fontsize=6)
    return save_figure(fig, out_dir, NAME, "learner step by phase")
