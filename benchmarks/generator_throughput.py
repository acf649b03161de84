"""Generator figures on the CPU default (vLLM CPU, embedded model).

- a group of n rollouts of one BFCL task: generated tokens/s, prefix-cache hit rate
- prefill vs decode: the same n prompts with 1 and with N new tokens, cold cache
- weight update: from the update call to the first token at the new version,
  for a safetensors directory and for tensors in memory

Prints a table and writes JSON (default benchmarks/results/generator_throughput.json).

    .venv/bin/python benchmarks/generator_throughput.py [--model embedded] [--n 8] [--task multi_turn_base_0]
"""

from __future__ import annotations

import argparse
import os
import time

from _report import write_report

from actors.generation.vllm_engine import VllmGenerator
from env_pool.bfcl.env import BfclEnv
from env_pool.interface.state import InterfaceState
from rollout.chat import ChatTokenizer
from rollout.generator import GenerationRequest, SamplingConfig
from rollout.play import GroupStats, run_group
from weights.model_assets import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="embedded, tiny or a model directory")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--task", default="multi_turn_base_0")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/generator_throughput.json")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    path = str(resolve_model(args.model))
    t0 = time.perf_counter()
    gen = VllmGenerator(path, max_model_len=8192)
    start_s = time.perf_counter() - t0
    chat = ChatTokenizer(gen.tokenizer)
    interface = InterfaceState(schema_lite=True, error_feedback=True, guidelines=True)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)

    # Prefill vs decode on the group's opening prompt, cold cache each time.
    prompt = chat.prompt_ids(BfclEnv().reset(args.task, interface))
    reqs = lambda k: [GenerationRequest(f"p{i}", prompt, k, seed=i) for i in range(args.n)]
    gen.reset_prefix_cache()
    t = time.perf_counter()
    gen.generate(reqs(1), sampling)
    prefill_s = time.perf_counter() - t
    gen.reset_prefix_cache()
    t = time.perf_counter()
    outs = gen.generate(
        [GenerationRequest(f"d{i}", prompt, args.max_new_tokens, seed=i) for i in range(args.n)],
        SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens),
    )
    full_s = time.perf_counter() - t
    decoded = sum(len(o.token_ids) for o in outs) - args.n
    decode_s = max(full_s - prefill_s, 1e-9)

    # A full multi-turn group.
    gen.reset_prefix_cache()
    stats = GroupStats()
    t = time.perf_counter()
    group = run_group(lambda: BfclEnv(), gen, chat, args.task, args.n, sampling, interface, seed=0, stats=stats)
    group_s = time.perf_counter() - t

    updates = _weight_updates(gen, path, prompt, args.updates)
    load_after = os.getloadavg()[0]

    report = {
        "benchmark": "generator_throughput",
        "model": args.model,
        "task": args.task,
        "n": args.n,
        "engine_start_s": start_s,
        "prompt_tokens": len(prompt),
        "prefill_s": prefill_s,
        "prefill_tokens_per_s": len(prompt) * args.n / prefill_s,
        "decode_s": decode_s,
        "decode_tokens_per_s": decoded / decode_s,
        "group": {
            "seconds": group_s,
            "generated_tokens": stats.generated_tokens,
            "generated_tokens_per_s": stats.generated_tokens / group_s,
            "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
            "rewards": [t.reward for t in group],
            "outcomes": [t.outcome for t in group],
        },
        "weight_update_to_first_token_s": {k: {"median": _median(v), "all": v} for k, v in updates.items()},
        "machine": {"cpus": os.cpu_count()},
        "outside_load_1min": {"before": load_before, "after": load_after},
    }
    _print_table(report, args.n, decoded, updates)
    write_report(args.out, report)
    gen.close()


def _weight_updates(gen, path: str, prompt: list[int], rounds: int) -> dict[str, list[float]]:
    """Seconds from each update call to the first token at the new version, per weight source."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(path, "model.safetensors"))
    probe = [GenerationRequest("u", prompt[:64], 1)]
    updates: dict[str, list[float]] = {"safetensors directory": [], "tensors in memory": []}
    for _ in range(rounds):
        for kind in updates:
            version = gen.policy_version + 1
            t = time.perf_counter()
            gen.update_weights(version, path if kind == "safetensors directory" else tensors)
            out = gen.generate(probe, SamplingConfig(temperature=0.0, max_new_tokens=1))[0]
            assert out.policy_version == version
            updates[kind].append(time.perf_counter() - t)
    return updates


def _print_table(report: dict, n: int, decoded: int, updates: dict[str, list[float]]) -> None:
    start_s, prefill_s, decode_s = report["engine_start_s"], report["prefill_s"], report["decode_s"]
    group_s, prompt_tokens = report["group"]["seconds"], report["prompt_tokens"]
    generated, hit_rate = report["group"]["generated_tokens"], report["group"]["prefix_cache_hit_rate"]
    load_before, load_after = report["outside_load_1min"]["before"], report["outside_load_1min"]["after"]
    rows = [
        ("engine start", f"{start_s:.1f} s"),
        ("opening prompt", f"{prompt_tokens} tokens x {n}"),
        (
            "prefill (cold, n prompts)",
            f"{prefill_s:.2f} s ({report['prefill_tokens_per_s']:.0f} tok/s; the prefix cache serves n-1)",
        ),
        ("decode", f"{decode_s:.2f} s for {decoded} tokens ({report['decode_tokens_per_s']:.1f} tok/s)"),
        (
            f"group of {n} rollouts",
            f"{group_s:.1f} s, {generated} tokens ({report['group']['generated_tokens_per_s']:.1f} tok/s)",
        ),
        ("prefix-cache hit rate in group", f"{hit_rate:.1%}"),
    ] + [(f"update ({k}) -> first token", f"{_median(v):.2f} s median") for k, v in updates.items()]
    for name, value in rows:
        print(f"{name:<44}{value}")
    print(f"outside load (1-min avg): {load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} cores")


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


if __name__ == "__main__":
    main()
