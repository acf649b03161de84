"""Blocking batches vs continuous batching on uneven multi-turn episodes; replicas; update latency per mode.

Episodes: --turns turns each; a turn asks for a number of new tokens drawn
from an uneven spread (--min-new .. --max-new, log-uniform, the same draws for
both engines), then an env step of --env-ms; the next turn's prompt is the
episode so far. BFCL's 1.5-7K-token prefills would make each point minutes on
two cores, so the prompts are random-token ones of --prompt-tokens: the
unevenness, not the env, is what the comparison is about.

- blocking: ``GeneratorServer`` over ``VllmGenerator`` (what the pipeline's
  generator actor runs): calls that arrive while a batch runs wait for the
  next one, and a batch lasts as long as its longest sequence;
- continuous: ``AsyncVllmGenerator`` (vLLM's AsyncLLM): each request joins the
  running batch and returns when it is done.

Both in this process, one after another (one vLLM engine at a time on the
cores), K episodes as K threads, at each --concurrency. Reported: generated
tokens/s, episodes/s, mean wait of an episode per generate call. Then, on
the continuous engine: tokens/s with 1 and 2 replicas at the highest
concurrency (two cores cannot show a gain; recorded), and the latency of a
weight update per mode with episodes in flight, against the bytes moved,
with the canary (one fixed prompt's logprobs) after it.
"""

from __future__ import annotations

import asyncio
import glob
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from actors.generation.async_vllm_engine import AsyncVllmGenerator
from actors.generation.server import GeneratorServer
from actors.generation.vllm_engine import VllmGenerator
from benchmarks._common import figure, log, save_figure, summary, table, target
from rollout.generator import GenerationRequest, SamplingConfig
from weights.model_assets import resolve_model

NAME = "generator"
MODES = ("pause", "keep", "abort")


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="embedded", help="embedded, tiny or a model directory")
    parser.add_argument("--concurrency", default="2,4,8,16", help="concurrent episodes, comma-separated")
    parser.add_argument("--turns", type=int, default=3, help="generate calls per episode")
    parser.add_argument("--episodes", type=int, default=0, help="episodes per point (0: 2 x concurrency)")
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--min-new", type=int, default=8, help="fewest new tokens a turn asks for")
    parser.add_argument("--max-new", type=int, default=160, help="most new tokens a turn asks for")
    parser.add_argument("--env-ms", type=float, default=5.0, help="an env step between turns")


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro, timeout: float = 1800):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _plan(args, episodes: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, new-token budget per turn) per episode; log-uniform budgets: many short turns, a few long."""
    rng = random.Random(seed)
    lo, hi = math.log(args.min_new), math.log(args.max_new)
    return [
        (
            [rng.randrange(200, 40000) for _ in range(args.prompt_tokens)],
            [int(math.exp(rng.uniform(lo, hi))) for _ in range(args.turns)],
        )
        for _ in range(episodes)
    ]


def _play(generate, plan, concurrency: int, env_s: float, seed: int) -> dict[str, Any]:
    """Run the planned episodes, ``concurrency`` at a time; generate(requests, sampling) -> outputs.

    One sampling config for every call, as in a run (the blocking server merges only calls
    with equal sampling); each turn's budget is the request's max_new_tokens."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=max(b for _, budgets in plan for b in budgets))

    waits: list[float] = []
    tokens = [0]
    lock = threading.Lock()

    def episode(i: int) -> None:
        prompt, budgets = plan[i]
        ids = list(prompt)
        for turn, budget in enumerate(budgets):
            req = GenerationRequest(f"e{seed}-{i}-{turn}", ids, budget, seed=seed * 7919 + i * 31 + turn)
            t0 = time.perf_counter()
            out = generate([req], sampling)[0]
            with lock:
                waits.append(time.perf_counter() - t0)
                tokens[0] += len(out.token_ids)
            ids = ids + list(out.token_ids) + [13, 220]  # the env's reply, two tokens
            time.sleep(env_s)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(episode, range(len(plan))))
    wall = time.perf_counter() - t0
    return {
        "tokens_per_s": tokens[0] / wall,
        "episodes_per_s": len(plan) / wall,
        "wait_per_call_s": sum(waits) / len(waits),
        "tokens": tokens[0],
        "wall_s": wall,
    }


def _blocking(args, levels: list[int]) -> dict[int, list[dict]]:
    server = GeneratorServer(lambda: VllmGenerator(args.model, max_model_len=2048, cpu_kv_cache_gb=1))
    try:
        return _sweep(args, levels, server.generate, "blocking")
    finally:
        server.generator.close()


def _sweep(args, levels, generate, label: str) -> dict[int, list[dict]]:
    _play(generate, _plan(args, 2, 999), 2, 0.0, 999)  # warm-up
    out: dict[int, list[dict]] = {}
    for k in levels:
        out[k] = []
        for r in range(args.repeats):
            episodes = args.episodes or 2 * k
            res = _play(generate, _plan(args, episodes, 100 * k + r), k, args.env_ms / 1000, 100 * k + r)
            out[k].append(res)
            log(
                f"[{NAME}] {label} x{k} repeat {r + 1}: {res['tokens_per_s']:.1f} tokens/s, wait {res['wait_per_call_s']:.2f} s/call"
            )
    return out


def _continuous(args, levels: list[int]) -> tuple[dict[int, list[dict]], dict[str, Any], dict[str, Any]]:
    loops = [_Loop(), _Loop()]
    gens = [AsyncVllmGenerator(args.model, max_model_len=2048, cpu_kv_cache_gb=1, update_timeout_s=600.0)]
    loops[0].run(gens[0].max_model_len())
    try:
        sweep = _sweep(args, levels, lambda reqs, s: loops[0].run(gens[0].generate(reqs, s)), "continuous")
        updates = _updates(args, gens[0], loops[0])
        gens.append(AsyncVllmGenerator(args.model, max_model_len=2048, cpu_kv_cache_gb=1, update_timeout_s=600.0))
        loops[1].run(gens[1].max_model_len())
        k = max(levels)
        replicas = {}
        for m in (1, 2):

            def generate(reqs, s, m=m):  # a group's requests to one replica, groups spread by id
                i = hash(reqs[0].request_id.split("-")[1]) % m
                return loops[i].run(gens[i].generate(reqs, s))

            rows = [
                _play(generate, _plan(args, args.episodes or k, 5000 + r), k, args.env_ms / 1000, 5000 + r)
                for r in range(args.repeats)
            ]
            replicas[str(m)] = {"tokens_per_s": summary([x["tokens_per_s"] for x in rows])}
            log(f"[{NAME}] {m} replica(s) x{k}: {replicas[str(m)]['tokens_per_s']['median']:.1f} tokens/s")
        return sweep, replicas, updates
    finally:
        for gen, loop in zip(gens, loops):
            loop.run(gen.close())


def _updates(args, gen, loop) -> dict[str, Any]:
    """Each mode with 8 episodes' requests in flight: update seconds, bytes, canary seconds."""
    weights = _load_weights(str(resolve_model(args.model)))
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    version = loop.run(_value(gen.policy_version))
    out: dict[str, Any] = {}
    for mode in MODES:
        rows = []
        for r in range(args.repeats):
            version += 1
            done = threading.Event()
            plan = _plan(args, 8, 9000 + r)
            player = threading.Thread(
                target=lambda plan=plan, r=r, done=done: (
                    _play(lambda q, s: loop.run(gen.generate(q, s)), plan, 8, 0.0, 9000 + r),
                    done.set(),
                )
            )
            player.start()
            time.sleep(0.5)  # requests in flight
            sec = loop.run(gen.update_weights(version, weights, mode=mode))
            t0 = time.perf_counter()
            loop.run(gen.prompt_logprobs(plan[0][0][:32]))
            canary = time.perf_counter() - t0
            player.join()
            rows.append({"update_s": sec, "canary_s": canary})
        out[mode] = {
            "update_s": summary([x["update_s"] for x in rows]),
            "canary_s": summary([x["canary_s"] for x in rows]),
            "bytes": nbytes,
        }
        log(f"[{NAME}] update {mode}: {out[mode]['update_s']['median']:.2f} s for {nbytes / 2**20:.0f} MiB")
    return out


async def _value(fn):
    return fn()


def _load_weights(path: str) -> dict:
    from safetensors.torch import load_file

    sd: dict = {}
    for f in sorted(glob.glob(f"{path}/*.safetensors")):
        sd.update(load_file(f))
    return sd


def run(args) -> dict[str, Any]:
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    if not levels or min(levels) < 1 or args.turns < 1 or not 1 <= args.min_new <= args.max_new:
        raise ValueError("--concurrency takes integers >= 1; --turns >= 1; 1 <= --min-new <= --max-new")
    blocking = _blocking(args, levels)
    continuous, replicas, updates = _continuous(args, levels)
    med = lambda rows, key: summary([x[key] for x in rows])["median"]
    b_tps = [med(blocking[k], "tokens_per_s") for k in levels]
    c_tps = [med(continuous[k], "tokens_per_s") for k in levels]
    speedup = [c / b if b else None for b, c in zip(b_tps, c_tps)]
    at8 = [s for k, s in zip(levels, speedup) if k >= 8 and s is not None]
    return {
        "model": args.model,
        "concurrency": levels,
        "turns": args.turns,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens_range": [args.min_new, args.max_new],
        "env_ms": args.env_ms,
        "blocking_tokens_per_s": b_tps,
        "continuous_tokens_per_s": c_tps,
        "speedup": speedup,
        "blocking_episodes_per_s": [med(blocking[k], "episodes_per_s") for k in levels],
        "continuous_episodes_per_s": [med(continuous[k], "episodes_per_s") for k in levels],
        "blocking_wait_per_call_s": [med(blocking[k], "wait_per_call_s") for k in levels],
        "continuous_wait_per_call_s": [med(continuous[k], "wait_per_call_s") for k in levels],
        "replicas_tokens_per_s": {m: v["tokens_per_s"]["median"] for m, v in replicas.items()},
        "update_s": {m: updates[m]["update_s"]["median"] for m in MODES},
        "canary_s": {m: updates[m]["canary_s"]["median"] for m in MODES},
        "update_bytes": updates[MODES[0]]["bytes"],
        "raw": {"blocking": blocking, "continuous": continuous, "replicas": replicas, "updates": updates},
        "targets": [
            target(
                "continuous / blocking tokens/s at >= 8 concurrent uneven episodes",
                min(at8) if at8 else None,
                ">=",
                1.3,
            )
        ],
        "notes": [
            "episodes: random-token prompts, log-uniform new-token budgets per turn, the same draws for both engines",
            "both engines in this process, one after another; replicas: two async engines on the same two cores",
        ],
    }


def render(report: dict[str, Any]) -> str:
    rows = [
        (k, b, c, s, bw, cw)
        for k, b, c, s, bw, cw in zip(
            report["concurrency"],
            report["blocking_tokens_per_s"],
            report["continuous_tokens_per_s"],
            report["speedup"],
            report["blocking_wait_per_call_s"],
            report["continuous_wait_per_call_s"],
        )
    ]
    text = table(
        rows, ["episodes", "blocking tok/s", "continuous tok/s", "speedup", "blocking wait s", "continuous wait s"]
    )
    reps = ", ".join(f"{m} replica(s) {v:.1f} tok/s" for m, v in report["replicas_tokens_per_s"].items())
    upd = ", ".join(f"{m} {report['update_s'][m]:.2f} s (canary {report['canary_s'][m]:.2f} s)" for m in MODES)
    return f"{text}\n{reps}\nupdate of {report['update_bytes'] / 2**20:.0f} MiB: {upd}"


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax, bx) = figure(2)
    ax.plot(report["concurrency"], report["blocking_tokens_per_s"], "o-", label="blocking")
    ax.plot(report["concurrency"], report["continuous_tokens_per_s"], "o-", label="continuous")
    ax.set_xlabel("concurrent episodes")
    ax.set_ylabel("generated tokens/s")
    ax.legend()
    bx.bar(list(report["update_s"]), list(report["update_s"].values()))
    bx.set_ylabel("update seconds")
    return save_figure(fig, out_dir, NAME, f"generator: blocking vs continuous, {report['model']}")
