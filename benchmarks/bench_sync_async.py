"""Sync vs async: the same config run in both modes in one Ray session, alternating.

Per repeat a sync pipeline and an async pipeline run warm-up + measured steps
(the order flips every repeat, so a drift in outside load hits both). From the
sync rows, where the stages run one after another:
  T_learn = the learner call's wall time, T_publish = weights to the generator,
  T_generate = the rest of the step (generation, env, transport).
Then overlap_efficiency = max(T_generate, T_learn) / T_step_async,
speedup = T_step_sync / T_step_async, ideal = (T_generate + T_learn) / max(...).
Ratios are formed within a repeat; the report gives their median and spread.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._common import error_bars, figure, log, median, save_figure, summary, table, target
from benchmarks._pipeline import PipelineRun, compose_cfg, env_fraction, ray_session, stage_times
from seal.config import TrainerConfig

NAME = "sync-async"
STAGES = ("env_actors", "generator", "learner")


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=3, help="measured learner steps per pipeline")
    parser.add_argument("--warmup", type=int, default=1, help="learner steps run first and not measured (>= 1)")


def _run_mode(overrides, mode: str, args) -> dict[str, Any]:
    extra = [f"trainer.mode={mode}"]
    cfg = compose_cfg([*overrides, *extra])
    pr = PipelineRun(cfg, [*overrides, *extra], args.steps, args.warmup)
    times = [stage_times(r) for r in pr.rows]
    batch = int(cfg.n) * pr.trainer.groups_per_step
    return {
        "t_step": median([t["step"] for t in times]),
        "t_learn": median([t["learn"] for t in times]),
        "t_publish": median([t["publish"] for t in times]),
        "t_generate": median([t["generate"] for t in times]),
        "step_s": [t["step"] for t in times],
        # Every step, warm-up included, with the learner's own busy seconds (diagnosis of odd steps).
        "steps": [
            {**stage_times(r), "learner_own_s": batch / r["learner_samples_per_s"], "warmup": i < args.warmup}
            for i, r in enumerate(pr.all_rows)
        ],
        "samples_per_s": median([batch / t["step"] for t in times]),
        "idle_ratio": {s: median([r["idle_ratio"][s] for r in pr.rows]) for s in STAGES},
        "staleness": pr.staleness,
        "env_fraction": env_fraction(pr.rows),
    }


def run(args) -> dict[str, Any]:
    cfg = compose_cfg(args.overrides)
    trainer = TrainerConfig.of(cfg)
    if trainer.max_staleness < 1:  # both modes run whatever trainer.mode says
        raise ValueError("the async runs need trainer.max_staleness >= 1")
    repeats = []
    with ray_session(cfg):
        for r in range(args.repeats):
            order = ("sync", "async") if r % 2 == 0 else ("async", "sync")
            modes = {}
            for mode in order:
                log(f"[{NAME}] repeat {r + 1}/{args.repeats}: {mode}")
                modes[mode] = _run_mode(args.overrides, mode, args)
            s, a = modes["sync"], modes["async"]
            longest = max(s["t_generate"], s["t_learn"])
            ideal = (s["t_generate"] + s["t_learn"]) / longest if longest else None
            speedup = s["t_step"] / a["t_step"] if a["t_step"] else None
            repeats.append(
                {
                    "order": list(order),
                    "sync": s,
                    "async": a,
                    "ideal_speedup": ideal,
                    "speedup": speedup,
                    "overlap_efficiency": longest / a["t_step"] if a["t_step"] else None,
                    "speedup_vs_ideal": speedup / ideal if speedup and ideal else None,
                }
            )
    agg = lambda key, mode=None: summary([(rep[mode] if mode else rep)[key] for rep in repeats])
    staleness = Counter(x for rep in repeats for x in rep["async"]["staleness"])
    report: dict[str, Any] = {
        "model": str(cfg.model.path),
        "env": str(cfg.env._target_).rsplit(".", 1)[-1],
        "n": int(cfg.n),
        "groups_per_step": trainer.groups_per_step,
        "max_staleness": trainer.max_staleness,
        "env_actors": int(cfg.cluster.env_actors),
        "max_new_tokens": int(cfg.sampling.max_new_tokens),
        "learner": f"{cfg.learner.cfg.backend}"
        + (f"-zero{cfg.learner.cfg.zero_stage}" if cfg.learner.cfg.backend == "deepspeed" else ""),
        "t_step_sync": agg("t_step", "sync")["median"],
        "t_step_async": agg("t_step", "async")["median"],
        "t_generate": agg("t_generate", "sync")["median"],
        "t_learn": agg("t_learn", "sync")["median"],
        "t_publish_sync": agg("t_publish", "sync")["median"],
        "overlap_efficiency": agg("overlap_efficiency")["median"],
        "speedup": agg("speedup")["median"],
        "ideal_speedup": agg("ideal_speedup")["median"],
        "speedup_vs_ideal": agg("speedup_vs_ideal")["median"],
        "spread": {k: agg(k) for k in ("overlap_efficiency", "speedup", "ideal_speedup", "speedup_vs_ideal")}
        | {f"t_step_{m}": agg("t_step", m) for m in ("sync", "async")},
        "idle_ratio": {
            m: {s: median([rep[m]["idle_ratio"][s] for rep in repeats]) for s in STAGES} for m in ("sync", "async")
        },
        "staleness": {
            "async_groups": dict(sorted(staleness.items())),
            "sync_max": max((x for rep in repeats for x in rep["sync"]["staleness"]), default=0),
        },
        "env_fraction": {m: median([rep[m]["env_fraction"] for rep in repeats]) for m in ("sync", "async")},
        "repeats": repeats,
        "notes": [
            "T_generate, T_learn and T_publish come from the sync rows (stages in sequence); T_generate is the step minus "
            "learning and publishing, so it includes env steps, transport and dispatch",
            "the ideal speedup leaves out T_publish, which async mode also overlaps, so a speedup slightly above the ideal is possible",
            "on a 2-core machine the overlapped stages compete for the same cores: overlap costs each stage speed",
        ],
    }
    report["targets"] = [
        target("async overlap efficiency", report["overlap_efficiency"], ">=", 0.9),
        target("async speedup / ideal speedup", report["speedup_vs_ideal"], ">=", 0.9),
        target("env pool share of generator time (async pipeline)", report["env_fraction"]["async"], "<=", 0.05),
    ]
    return report


def render(report: dict[str, Any]) -> str:
    sp = report["spread"]
    rows = [
        ("T_step sync (s)", report["t_step_sync"], sp["t_step_sync"]["min"], sp["t_step_sync"]["max"]),
        ("T_step async (s)", report["t_step_async"], sp["t_step_async"]["min"], sp["t_step_async"]["max"]),
        ("T_generate (s, sync)", report["t_generate"], None, None),
        ("T_learn (s, sync)", report["t_learn"], None, None),
        ("T_publish (s, sync)", report["t_publish_sync"], None, None),
    ]
    rows += [
        (k, report[k], sp[k]["min"], sp[k]["max"])
        for k in ("speedup", "ideal_speedup", "speedup_vs_ideal", "overlap_efficiency")
    ]
    out = [table(rows, ["figure", "median", "min", "max"])]
    idle = [(m, *[report["idle_ratio"][m][s] for s in STAGES], report["env_fraction"][m]) for m in ("sync", "async")]
    out.append(table(idle, ["mode", *[f"idle {s}" for s in STAGES], "env/generate"]))
    out.append(
        f"staleness of the groups trained in async mode: {report['staleness']['async_groups']} "
        f"(sync max {report['staleness']['sync_max']})"
    )
    return "\n\n".join(out)


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax, ax2) = figure(2)
    sp = report["spread"]
    med, err = error_bars([sp["t_step_sync"], sp["t_step_async"]])
    ax.bar(["step sync", "step async"], med, yerr=err, color=["tab:grey", "tab:blue"])
    ax.bar(["gen | learn | publish (sync)"], [report["t_generate"] or 0], color="tab:orange", label="generate")
    ax.bar(
        ["gen | learn | publish (sync)"],
        [report["t_learn"] or 0],
        bottom=[report["t_generate"] or 0],
        color="tab:green",
        label="learn",
    )
    ax.bar(
        ["gen | learn | publish (sync)"],
        [report["t_publish_sync"] or 0],
        bottom=[(report["t_generate"] or 0) + (report["t_learn"] or 0)],
        color="tab:red",
        label="publish",
    )
    ax.set_ylabel("seconds (median; bars: min..max)")
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    hist = report["staleness"]["async_groups"]
    ax2.bar([str(k) for k in hist], list(hist.values()), color="tab:blue")
    ax2.set_xlabel("staleness (policy versions) of trained groups, async")
    ax2.set_ylabel("groups")
    title = (
        f"sync vs async ({report['model']}, {report['env']}): speedup {report['speedup'] or 0:.2f} "
        f"of ideal {report['ideal_speedup'] or 0:.2f}, overlap {report['overlap_efficiency'] or 0:.2f}"
    )
    return save_figure(fig, out_dir, NAME, title)
