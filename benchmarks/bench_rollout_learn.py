"""Rollout vs learning: each stage alone, then the same stages inside the running pipeline.

Per repeat, one pipeline is built. Before it runs, its own idle actors are
timed alone (same processes, same placement, nothing else running):
  - generator: one batch (trainer.groups_per_step groups of n rollouts, played
    concurrently from this process as env actors would, so the generator
    batches them) -> generated tokens/s, trajectories/s, seconds per batch;
  - env: the batch's recorded assistant texts replayed through fresh envs
    (same steps, same verifier) -> env steps/s;
  - learner: one update on that batch -> samples/s, tokens/s, seconds.
Then the pipeline runs warm-up + measured steps and the same figures come from
its metrics rows. A warm-up batch and update come first in the alone phase
(the engine's and optimizer's first calls are slow); the alone phase trains
the learner twice before the pipeline starts, which changes no throughput.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from actors.generation.server import RemoteGenerator
from benchmarks._common import error_bars, figure, log, median, save_figure, summary, table, target
from benchmarks._pipeline import PipelineRun, compose_cfg, env_fraction, ray_session, trajectories_per_s
from env_pool.base import play_scripted
from env_pool.interface.state import InterfaceState
from env_pool.tags import RELEASED_BASE_WEIGHTS
from rollout.chat import ChatTokenizer
from rollout.play import GroupStats, run_group
from seal.config import TrainerConfig, instantiate, instantiate_spec
from weights.model_assets import load_tokenizer

NAME = "rollout-learn"
METRICS = (
    "gen_tokens_per_s",
    "gen_tokens_per_busy_s",
    "trajectories_per_s",
    "env_steps_per_s",
    "learner_samples_per_s",
    "learner_tokens_per_s",
    "generate_s_per_group",
    "t_learn_batch",
)


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=3, help="measured learner steps per pipeline")
    parser.add_argument("--warmup", type=int, default=1, help="learner steps run first and not measured (>= 1)")


def _alone(pipeline) -> dict[str, float]:
    import ray

    cfg = pipeline.cfg
    groups, n = pipeline.trainer.groups_per_step, int(cfg.n)
    env_spec = OmegaConf.to_container(cfg.env, resolve=True)
    sampling = instantiate(cfg.sampling)
    interface = InterfaceState.from_dict(ray.get(pipeline.actors.coordinator.interface.remote()).state)
    generator = RemoteGenerator(pipeline.actors.generator)
    # One tokenizer per concurrent group: a fast tokenizer shared across threads can raise "Already borrowed".
    chats = [ChatTokenizer(load_tokenizer(str(cfg.model.path))) for _ in range(groups)]

    def batch(tag: str) -> tuple[float, list, list, list[GroupStats]]:
        envs: list = []

        def make_env():
            env = instantiate_spec(env_spec)
            envs.append(env)
            return env

        stats = [GroupStats() for _ in range(groups)]
        tasks = [pipeline.task_ids[i % len(pipeline.task_ids)] for i in range(groups)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(groups) as pool:
            futures = [
                pool.submit(
                    functools.partial(
                        run_group,
                        make_env,
                        generator,
                        chats[i],
                        tasks[i],
                        n,
                        sampling,
                        interface,
                        group_id=f"alone-{tag}-{i}",
                        seed=1000 + i,
                        stats=stats[i],
                    )
                )
                for i in range(groups)
            ]
            trajs = [t for f in futures for t in f.result()]
        return time.perf_counter() - t0, trajs, [e.result() for e in envs], stats

    def learn(trajs) -> float:
        t0 = time.perf_counter()
        pipeline.actors.learners.train_now(trajs, RELEASED_BASE_WEIGHTS, partial=True)
        return time.perf_counter() - t0

    warm = batch("warmup")
    learn(warm[1])
    t_gen, trajs, episodes, stats = batch("measured")
    t_learn = learn(trajs)
    # Env alone: the same assistant texts through fresh envs, repeated until
    # the timing is long enough to mean something (the toy env takes microseconds).
    env = instantiate_spec(env_spec)
    # Counted as the pipeline counts it: the env's own step and judge seconds.
    steps, env_s, wall, passes = 0, 0.0, 0.0, 0
    while wall < 0.5 and passes < 1000:
        t0 = time.perf_counter()
        for ep in episodes:
            res = play_scripted(env, ep.task_id, ep.turns, interface)
            steps += res.num_steps
            env_s += res.env_seconds + res.judge_seconds
        wall += time.perf_counter() - t0
        passes += 1
    tokens = sum(t.num_generated_tokens for t in trajs)
    samples = len(trajs)
    return {
        "gen_tokens_per_s": tokens / t_gen,
        "gen_tokens_per_busy_s": tokens / t_gen,
        "trajectories_per_s": samples / t_gen,
        "env_steps_per_s": steps / env_s if env_s else None,
        "learner_samples_per_s": samples / t_learn,
        "learner_tokens_per_s": tokens / t_learn,
        "generate_s_per_group": sum(s.generate_s for s in stats) / groups,
        "t_learn_batch": t_learn,
        "t_generate_batch": t_gen,
        "generated_tokens": tokens,
    }


def _in_pipeline(rows: list[dict[str, Any]], n: int) -> dict[str, float]:
    return {
        "gen_tokens_per_s": median([r["gen_tokens_per_s"] for r in rows]),
        # The generator's own speed: tokens per second it was busy (alone it is busy the whole batch).
        "gen_tokens_per_busy_s": median(
            [
                r["gen_tokens_per_s"] / (1.0 - r["idle_ratio"]["generator"])
                for r in rows
                if r["idle_ratio"]["generator"] is not None and r["idle_ratio"]["generator"] < 1.0
            ]
        ),
        "trajectories_per_s": median([trajectories_per_s(r, n) for r in rows]),
        "env_steps_per_s": median([r["env_steps_per_s"] for r in rows]),
        # The learner's own rates while generation runs beside it (contention shows here).
        "learner_samples_per_s": median([r["learner_samples_per_s"] for r in rows]),
        "learner_tokens_per_s": median([r["learner_tokens_per_s"] for r in rows]),
        "generate_s_per_group": median(
            [r["wait_s"]["generate"] / r["groups_generated"] for r in rows if r["groups_generated"]]
        ),
        "t_learn_batch": median([r["wait_s"]["learner"] for r in rows]),
        "step_s": median([r["step_s"] for r in rows]),
    }


def run(args) -> dict[str, Any]:
    cfg = compose_cfg(args.overrides)
    trainer = TrainerConfig.of(cfg)
    n = int(cfg.n)
    repeats = []
    with ray_session(cfg):
        for r in range(args.repeats):
            log(f"[{NAME}] repeat {r + 1}/{args.repeats}")
            pr = PipelineRun(cfg, args.overrides, args.steps, args.warmup, before=_alone)
            alone, inside = pr.before_result, _in_pipeline(pr.rows, n)
            repeats.append(
                {
                    "alone": alone,
                    "pipeline": inside,
                    "env_fraction": env_fraction(pr.rows),
                    "pipeline_over_alone": {
                        k: (inside[k] / alone[k] if alone[k] and inside[k] is not None else None) for k in METRICS
                    },
                    "generate_over_learn": alone["t_generate_batch"] / alone["t_learn_batch"],
                }
            )
    agg = lambda path: summary([_get(rep, path) for rep in repeats])
    report = {
        "mode": trainer.mode,
        "model": str(cfg.model.path),
        "env": str(cfg.env._target_).rsplit(".", 1)[-1],
        "n": n,
        "groups_per_step": trainer.groups_per_step,
        "max_new_tokens": int(cfg.sampling.max_new_tokens),
        "alone": {k: agg(("alone", k)) for k in (*METRICS, "t_generate_batch")},
        "pipeline": {k: agg(("pipeline", k)) for k in (*METRICS, "step_s")},
        "pipeline_over_alone": {k: agg(("pipeline_over_alone", k)) for k in METRICS},
        "t_generate_batch": agg(("alone", "t_generate_batch"))["median"],
        "t_learn_batch": agg(("alone", "t_learn_batch"))["median"],
        "generate_over_learn": agg(("generate_over_learn",)),
        "env_fraction": agg(("env_fraction",)),
        "repeats": repeats,
        "notes": [
            "alone: the pipeline's own generator and learner actors, idle otherwise, driven from the benchmark process",
            "pipeline gen_tokens_per_s and trajectories_per_s are per wall second of a learner step (what the pipeline "
            "delivers); gen_tokens_per_busy_s, env_steps_per_s and the learner's rates are per second of that stage's own "
            "busy time (their ratio to alone shows contention; the generator's busy time includes loading weights)",
            "env_fraction = env + verifier + diagnosis seconds / generator-wait seconds, summed over the same groups",
        ],
    }
    report["targets"] = [
        target("env pool share of generator time in the pipeline", report["env_fraction"]["median"], "<=", 0.05)
    ]
    return report


def _get(d: dict, path: tuple) -> Any:
    for key in path:
        d = d.get(key) if isinstance(d, dict) else None
    return d


def render(report: dict[str, Any]) -> str:
    rows = [
        (
            k,
            report["alone"][k]["median"],
            report["pipeline"][k]["median"],
            report["pipeline_over_alone"][k]["median"],
            f"{_fmt_range(report['pipeline_over_alone'][k])}",
        )
        for k in METRICS
    ]
    out = [table(rows, ["stage figure", "alone", "in pipeline", "ratio", "ratio min..max"])]
    out.append(
        f"one batch ({report['groups_per_step']} groups x {report['n']}) alone: generate {report['t_generate_batch']:.2f} s, "
        f"learn {report['t_learn_batch']:.2f} s (generate/learn {report['generate_over_learn']['median']:.2f})"
    )
    ef = report["env_fraction"]["median"]
    out.append(f"env pool / generator time in the pipeline: {ef:.3%}" if ef is not None else "env pool share: -")
    return "\n".join(out)


def _fmt_range(s: dict[str, Any]) -> str:
    return "-" if s["min"] is None else f"{s['min']:.2f}..{s['max']:.2f}"


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax, ax2) = figure(2)
    keys = [k for k in METRICS if report["pipeline_over_alone"][k]["median"] is not None]
    med, err = error_bars([report["pipeline_over_alone"][k] for k in keys])
    ax.barh(keys, med, xerr=err, color="tab:blue")
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set_xlabel("in pipeline / alone (median, min..max)")
    ax.tick_params(axis="y", labelsize=7)
    bars = [report["alone"]["t_generate_batch"], report["alone"]["t_learn_batch"]]
    med, err = error_bars(bars)
    ax2.bar(["generate one batch", "learn one batch"], med, yerr=err, color=["tab:orange", "tab:green"])
    ax2.set_ylabel("seconds (alone)")
    return save_figure(
        fig, out_dir, NAME, f"rollout vs learning ({report['model']}, {report['env']}, {report['mode']})"
    )
