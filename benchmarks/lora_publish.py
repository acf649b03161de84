"""A LoRA adapter publish vs a whole-model publish to the blocking vLLM engine (issue 49).

Whole model: the learner's versioned safetensors snapshot (fp32, as `seal train` writes it) and the
engine's in-place reload (``VllmGenerator.update_weights``). Adapter: peft's adapter directory
(``learner.lora.write_adapter``) and ``VllmGenerator.load_adapter`` on an engine serving the base
with LoRA slots. Bytes are the files written; seconds run from the learner's write to the engine
having loaded, median over ``--rounds`` publishes. Each side has its own engine (one at a time).
Prints one JSON line and writes it (default benchmarks/results/lora_publish.json).

    .venv/bin/python benchmarks/lora_publish.py [--model embedded] [--rank 8] [--dtype auto] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def learner(model: str, lora):
    from learner.engine import Learner, LearnerConfig
    from learner.loss import LossConfig

    loss = LossConfig(kl_coef=0.0)  # no reference: only the weights out matter here
    cfg = LearnerConfig(backend="torch", dtype="float32", mini_batch_groups=1, micro_batch_size=1, loss=loss, lora=lora)
    return Learner(model, cfg, group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


def main() -> None:
    from _report import write_report

    from actors.generation.adapters import VLLM_LORA_RANKS
    from actors.generation.vllm_engine import VllmGenerator
    from learner.lora import LoraConfig, write_adapter
    from weights.model_assets import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--dtype", default="auto", help="the generator's: auto | bfloat16 | float32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/lora_publish.json")
    args = p.parse_args()
    model = str(resolve_model(args.model))
    out = Path(tempfile.mkdtemp(prefix="lora_publish_"))
    report: dict = {"model": args.model, "rank": args.rank, "rounds": args.rounds}

    full = learner(model, None)
    gen = VllmGenerator(model, max_model_len=1024, cpu_kv_cache_gb=0.5, dtype=args.dtype)
    report["generator_dtype"] = gen.dtype
    seconds = []
    for version in range(1, args.rounds + 1):
        t = time.perf_counter()
        path, _ = full.weights_out.save_snapshot(out / "full", version, full.step)
        gen.update_weights(version, str(path))
        seconds.append(time.perf_counter() - t)
    report["full_bytes"] = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
    report["full_publish_s"] = statistics.median(seconds)
    gen.close()
    del full, gen

    lrn = learner(model, LoraConfig(rank=args.rank))
    report["trainable_parameters"] = sum(p.numel() for p in lrn.model.parameters() if p.requires_grad)
    report["frozen_parameters"] = sum(p.numel() for p in lrn.model.parameters() if not p.requires_grad)
    slot_rank = min(r for r in VLLM_LORA_RANKS if r >= args.rank)  # vLLM takes only these
    gen = VllmGenerator(model, max_model_len=1024, cpu_kv_cache_gb=0.5, dtype=args.dtype, max_lora_rank=slot_rank)
    seconds = []
    for version in range(1, args.rounds + 1):
        t = time.perf_counter()
        directory, nbytes = write_adapter(lrn.model, out / f"adapter-v{version}")
        gen.load_adapter(version, str(directory))
        seconds.append(time.perf_counter() - t)
    gen.close()
    report["adapter_bytes"] = nbytes
    report["adapter_publish_s"] = statistics.median(seconds)
    report["bytes_ratio"] = report["full_bytes"] / report["adapter_bytes"]
    report["seconds_ratio"] = report["full_publish_s"] / report["adapter_publish_s"]
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()})
    write_report(args.out, report)


if __name__ == "__main__":
    main()
