"""Weight publishing: learner weights -> generator -> first token at the new version, vs model size.

For each model the pipeline's own generator and learner actors are started
(seal/runtime/actor_set.ActorSet: same classes, options and placement as in a
training run) and a publish is timed exactly as the pipeline does it:
learner.weights() (gathered bucket by bucket, each bucket into Ray's object store;
a manifest of them returned) -> generator update_weights(version, manifest)
(buckets fetched and loaded one at a time: vLLM reload in place, prefix cache reset) ->
a 1-token greedy request whose output must carry the new version.
With --lora R each model is measured twice, in one run: training every weight, and as a rank-R
LoRA learner whose publishes carry the adapter alone to replicas serving it on the base
(``learner.cfg.lora.rank=R``); the report gives LoRA against full in bytes and seconds.
The memory-copy bound is measured in the same run on the same bytes: the
published arrays cloned once (torch) in this process. One warm-up publish
comes first; the repeats alternate with nothing else running.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import error_bars, figure, log, save_figure, summary, table, target
from benchmarks._pipeline import compose_cfg, ray_session
from rollout.generator import GenerationRequest, SamplingConfig
from seal.config import Settings, instantiate
from seal.runtime.actor_set import ActorSet

NAME = "weights"
PROBE_TOKENS = 32


def add_arguments(parser) -> None:
    parser.add_argument(
        "--models", default="tiny,embedded", help="embedded, tiny or model directories, comma-separated"
    )
    parser.add_argument(
        "--lora", type=int, default=None, metavar="RANK", help="each model also as a rank-RANK LoRA learner"
    )


def _model_overrides(model: str) -> list[str]:
    return [f"model={model}"] if model in ("tiny", "embedded") else ["model=local", f"model.path={model}"]


def _memcpy_s(manifest, repeats: int) -> list[float]:
    import ray
    import torch

    tensors = [
        torch.from_numpy(a.copy())
        for ref in manifest.buckets  # writable, in this process
        for a in ray.get(ref, timeout=600).values()
        if isinstance(a, np.ndarray)
    ]
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        copies = [t.clone() for t in tensors]
        times.append(time.perf_counter() - t0)
        del copies
    return times[1:]  # the first clone also faults the pages in


def _measure_model(cfg, repeats: int) -> dict[str, Any]:
    import ray

    # No env actors are started, so nothing ever connects to the replay address.
    actors = ActorSet(cfg, Settings.of(cfg), instantiate(cfg.cluster), "tcp://127.0.0.1:9")
    try:
        greedy = SamplingConfig(temperature=0.0, max_new_tokens=1)
        probe = [GenerationRequest("probe", list(range(1000, 1000 + PROBE_TOKENS)), 1)]
        ray.get(actors.generator.generate.remote(probe, greedy))
        manifest = actors.learners.weights()
        model_bytes, buckets = manifest.total_bytes, len(manifest.buckets)
        log(f"[{NAME}] {manifest.describe()}")
        memcpy = _memcpy_s(manifest, repeats)
        del manifest
        runs = []
        for version in range(1, repeats + 2):
            t0 = time.perf_counter()
            manifest = actors.learners.weights()  # every rank gathers; rank 0 puts the buckets
            t1 = time.perf_counter()
            engine_s = ray.get(actors.generator.update_weights.remote(version, manifest), timeout=600)
            t2 = time.perf_counter()
            out = ray.get(actors.generator.generate.remote(probe, greedy))[0]
            t3 = time.perf_counter()
            if out.policy_version != version:
                raise RuntimeError(f"first token after publishing v{version} came from v{out.policy_version}")
            runs.append(
                {
                    "publish_s": t3 - t0,
                    "gather_s": t1 - t0,
                    "update_s": t2 - t1,
                    "engine_load_s": engine_s,
                    "first_token_s": t3 - t2,
                }
            )
            del manifest
        runs = runs[1:]  # the first publish is the warm-up
    finally:
        actors.close()
    return {
        "model_bytes": model_bytes,
        "buckets": buckets,
        "memcpy": summary(memcpy),
        "runs": runs,
        **{
            k: summary([r[k] for r in runs])
            for k in ("publish_s", "gather_s", "update_s", "engine_load_s", "first_token_s")
        },
        "publish_over_memcpy": summary([r["publish_s"] / m for r, m in zip(runs, memcpy)]),
    }


def run(args) -> dict[str, Any]:
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise ValueError("--models names no model")
    lora = getattr(args, "lora", None)
    systems: list[tuple[str, list[str]]] = [("", [])] + (
        [(f"+lora{lora}", [f"learner.cfg.lora.rank={lora}"])] if lora is not None else []
    )
    per_model = {}
    with ray_session(compose_cfg(args.overrides)):
        for model in models:
            for suffix, extra in systems:
                cfg = compose_cfg([*args.overrides, *_model_overrides(model), *extra])
                log(f"[{NAME}] {model}{suffix}: starting generator and learner actors")
                per_model[model + suffix] = _measure_model(cfg, args.repeats)
    plain = models
    models = [m + suffix for m in plain for suffix, _ in systems]
    report: dict[str, Any] = {
        "models": models,
        "publish_s": [per_model[m]["publish_s"]["median"] for m in models],
        "memcpy_s": [per_model[m]["memcpy"]["median"] for m in models],
        "model_bytes": [per_model[m]["model_bytes"] for m in models],
        "buckets": [per_model[m]["buckets"] for m in models],
        "publish_over_memcpy": [per_model[m]["publish_over_memcpy"]["median"] for m in models],
        "breakdown": {
            m: {k: per_model[m][k]["median"] for k in ("gather_s", "update_s", "engine_load_s", "first_token_s")}
            for m in models
        },
        "spread": {m: {k: per_model[m][k] for k in ("publish_s", "memcpy", "publish_over_memcpy")} for m in models},
        "probe_prompt_tokens": PROBE_TOKENS,
        "learner": f"{compose_cfg(args.overrides).learner.cfg.backend}",
        "notes": [
            "publish_s: learner.weights() -> object store -> generator update_weights (vLLM reload, prefix-cache reset) -> "
            "first token carrying the new version; the pipeline's path (its rows report the same as publish_s)",
            "gather_s: the learner's weights into the object store, bucket by bucket (learner.cfg.weight_bucket_mb); "
            "update_s: fetching and loading the buckets as the driver sees it",
            "memcpy_s: the same arrays cloned once in one process (torch), the floor for moving these bytes",
        ],
    }
    embedded = [p for m, p in zip(models, report["publish_s"]) if m == "embedded"]
    if embedded:
        report["targets"] = [target("weight publish, embedded model (s)", embedded[0], "<", 2.0)]
    if lora is not None:
        report["lora_rank"] = lora
        report["lora_vs_full"] = {m: lora_ratios(per_model[m], per_model[f"{m}+lora{lora}"]) for m in plain}
        ratios = report["lora_vs_full"][plain[-1]]  # issue 49's targets, on the largest model measured last
        report.setdefault("targets", []).extend(
            [
                target(f"full / LoRA publish bytes ({plain[-1]})", ratios["publish_bytes_ratio"], ">=", 20.0),
                target(f"full / LoRA publish seconds ({plain[-1]})", ratios["publish_s_ratio"], ">=", 10.0),
            ]
        )
    return report


def lora_ratios(full: dict[str, Any], lora: dict[str, Any]) -> dict[str, float]:
    """Full against LoRA for one model: bytes published, and seconds from the learner to the first
    token at the new version (medians)."""
    return {
        "publish_bytes_ratio": full["model_bytes"] / max(lora["model_bytes"], 1),
        "publish_s_ratio": full["publish_s"]["median"] / lora["publish_s"]["median"],
    }


def render(report: dict[str, Any]) -> str:
    rows = []
    for i, m in enumerate(report["models"]):
        b = report["breakdown"][m]
        rows.append(
            (
                m,
                report["model_bytes"][i] / 2**20,
                report["publish_s"][i],
                report["memcpy_s"][i],
                report["publish_over_memcpy"][i],
                b["gather_s"],
                b["update_s"],
                b["first_token_s"],
            )
        )
    text = table(rows, ["model", "MiB", "publish s", "memcpy s", "x memcpy", "gather s", "update s", "1st token s"])
    for m, r in report.get("lora_vs_full", {}).items():
        text += (
            f"\nLoRA rank {report['lora_rank']} vs full, {m}: publish {r['publish_bytes_ratio']:.1f}x fewer bytes, "
            f"{r['publish_s_ratio']:.1f}x shorter to the first token at the new version"
        )
    return text


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax,) = figure(1)
    mib = [b / 2**20 for b in report["model_bytes"]]
    med, err = error_bars([report["spread"][m]["publish_s"] for m in report["models"]])
    ax.errorbar(mib, med, yerr=err, marker="o", capsize=3, label="publish -> first token")
    med, err = error_bars([report["spread"][m]["memcpy"] for m in report["models"]])
    ax.errorbar(mib, med, yerr=err, marker="s", capsize=3, label="memory copy of the same bytes")
    for x, y, m in zip(mib, report["publish_s"], report["models"]):
        ax.annotate(m, (x, y), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published weights (MiB)")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, NAME, "weight publish latency vs model size")
