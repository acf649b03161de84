"""`seal evaluate RUN_DIR` (SEAGym metrics over a run's snapshots) and
`seal report RUN_DIR` (markdown and plots from them).

Evaluation reads the run (config.yaml, snapshots/, metrics.jsonl) and writes
only under RUN_DIR/evaluation and RUN_DIR/report: it never touches the
checkpoint, the capability state or the interface, and nothing it runs feeds
back into training. Every task is run with the raw benchmark interface at
temperature 0 (one greedy rollout), a view's tasks BATCH_TASKS at a time played
together as the closing evaluation plays its tasks (one engine batch per
generation step; the OOD harness views one task at a time), with a progress line per
batch and, between them, at least one line every 30 s with what runs and the time left
(evaluate_progress.py); one snapshot at a time: the engine is closed before the next
snapshot's weights are loaded.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from evaluation.catalog import build_views
from evaluation.metrics import summarize
from evaluation.ood_runner import OodRunner
from evaluation.ood_views import harness_notes, is_harness, note_lines, unavailable_views
from evaluation.records import OOD_TEST, SnapshotInfo, read_task_csv, write_task_csv
from evaluation.report import write_report
from evaluation.runner import ResultCache, missing, play_tasks, run_view, settings_key
from evaluation.view_base import ViewContext
from evaluation.views import schedule_record, validation_task_ids
from seal.chat_setup import chat_tokenizer
from seal.commands.evaluate_progress import EvalProgress
from seal.commands.rehearse_report import REPORT_JSON
from seal.config import LearnerGroupConfig, TrainerConfig, config_dir, instantiate, target_of
from seal.console import output_to_file, stdout_to_stderr
from seal.console import results as result_stream
from seal.errors import CliError
from seal.run.run_dir import apply_settings, recorded_config
from seal.run.snapshots import read_snapshots, snapshot_weights
from seal.run.task_fit import select_tasks
from seal.runtime.generator_spec import local_generator

EVAL_DIR, REPORT_DIR = "evaluation", "report"
ENGINE_LOG = "evaluate.log"  # the engine's own output (vLLM's start-up and warnings), under EVAL_DIR
# Tasks of a view played together, one engine batch per generation step (as the closing evaluation
# plays its tasks), cached as each batch ends: a progress line and an interrupted run's results per batch.
BATCH_TASKS = 64
# These shape training too (the training pool leaves them out): evaluating a
# run with other values would validate on tasks it trained on.
TRAINING_KEYS = ("evaluation.validation_size", "evaluation.heldout_categories")


def run_dir_arg(value: str | None, command: str) -> Path:
    """RUN_DIR of `seal evaluate` / `seal report`, or CliError with one line naming the fix."""
    written = "`seal train` writes runs/<timestamp> and its closing note names it"
    if not value:
        latest = latest_run(Path("runs"))
        hint = f"e.g. `seal {command} {latest}` (the latest run here)" if latest else written
        raise CliError(f"seal {command} needs a run directory: {hint}")
    path = Path(value)
    if not path.is_dir():
        raise CliError(f"{value}: no such run directory ({written})")
    if not (path / "config.yaml").is_file():
        raise CliError(f"{value} is not a run directory (no config.yaml; {written})")
    return path


def latest_run(runs: Path) -> Path | None:
    """The run directory under ``runs`` whose config was written last, leaving out rehearsals
    (`seal rehearse` writes runs/rehearse-<recipe>-<time>: a tiny model's few steps, nothing to evaluate)."""
    found = [
        p.parent
        for p in runs.glob("*/config.yaml")
        if not p.parent.name.startswith("rehearse-") and not (p.parent / REPORT_JSON).exists()
    ]
    return max(found, key=lambda d: ((d / "config.yaml").stat().st_mtime, d.name), default=None)


def load_run_config(run_dir: Path, overrides: list[str]):
    """The run's recorded config (seal/run/run_dir.py), ``key=value`` overrides applied."""
    cfg = recorded_config(run_dir)
    for item in overrides:
        key = item.partition("=")[0].lstrip("+")
        if key in TRAINING_KEYS:
            raise ValueError(f"{key} must stay what the run trained with ({OmegaConf.select(cfg, key)})")
    apply_settings(cfg, overrides, "seal evaluate")
    return cfg


def eval_sampling(cfg, eval_cfg):
    node = OmegaConf.load(config_dir() / "sampling" / "eval.yaml")  # greedy, whatever the run trained with
    if eval_cfg.max_new_tokens is not None:
        node.max_new_tokens = int(eval_cfg.max_new_tokens)
    sampling = instantiate(node)
    if sampling.temperature != 0.0:
        raise ValueError("evaluation samples at temperature 0 (configs/sampling/eval.yaml)")
    return sampling


def _snapshot_info(record: dict[str, Any]):
    return SnapshotInfo(
        name=record["name"],
        step=int(record["step"]),
        policy_version=int(record["policy_version"]),
        interface_version=int(record["interface_version"]),
        wall_s=float(record.get("wall_s", 0.0)),
        update_tokens=int(round(float(record.get("update_tokens", 0)))),
    )


def _views(cfg, eval_cfg, records, names, groups_per_step: int):
    probe = instantiate(cfg.env)

    @cache
    def pool() -> tuple[str, ...]:
        return tuple(select_tasks(cfg)[0])  # the exact pool the run's task stream cycled over

    trained = max(int(r["step"]) for r in records) * groups_per_step
    ctx = ViewContext(eval_cfg, probe.task_ids, pool, trained)
    views = build_views(names, ctx)
    env_of = {v.name: OmegaConf.to_container(cfg.env, resolve=True) if v.env is None else dict(v.env) for v in views}
    return views, env_of, pool


def _snapshot_keys(cfg, record: dict[str, Any], views, env_of, sampling) -> dict[str, str]:
    """The cache key of each view on one snapshot: what decides a greedy rollout."""
    # record["weights"] (relative to the run, or the base model's name) keeps the cache valid if the run moves.
    return {
        v.name: settings_key(
            weights=record["weights"],
            env=env_of[v.name],
            sampling=asdict(sampling),
            seed=int(cfg.seed),
            interface="raw",
        )
        for v in views
    }


def _run_snapshot(
    cfg, run_dir: Path, record: dict[str, Any], views, env_of, sampling, progress: EvalProgress
) -> tuple[list, dict[str, Any]]:
    """Every runnable view on one snapshot, each view's tasks played BATCH_TASKS at a time; the
    engine starts only when the cache lacks a result (its own output to evaluate.log), and is
    closed before returning."""
    name, weights, seed = record["name"], snapshot_weights(run_dir, record), int(cfg.seed)
    cache = ResultCache(run_dir / EVAL_DIR / "cache", name)
    keys = _snapshot_keys(cfg, record, views, env_of, sampling)
    todo = missing({v.name: v.task_ids for v in views}, cache, keys)
    log = run_dir / EVAL_DIR / ENGINE_LOG
    started, generator, chat, results, ood = time.perf_counter(), None, None, [], None
    try:
        if todo:
            progress.engine_starts(name, weights, todo, log)
            with output_to_file(log):
                generator = local_generator(cfg.generator, model_path=weights)
            chat = chat_tokenizer(cfg, generator.tokenizer)
            ood = OodRunner(
                generator, sampling, snapshot=name, seed=seed, details=run_dir / EVAL_DIR / "ood" / f"{name}.jsonl"
            )
        for view in views:
            env_node = OmegaConf.create(env_of[view.name])
            make_env = lambda node=env_node: instantiate(node)  # one env per episode

            def runner(task_ids, view=view.name, make_env=make_env):
                progress.batch_starts(name, view, task_ids)
                with output_to_file(log):
                    if is_harness(env_of[view]):  # tau2 / BFCL memory: the harness drives each episode
                        assert ood is not None  # a task to run means the engine and its harness runner started
                        return [ood.run(env_of[view], view, t) for t in task_ids]
                    return play_tasks(
                        make_env, generator, chat, task_ids, sampling, snapshot=name, view=view, seed=seed
                    )

            done = 0

            def step(count: int, ran: bool, view=view) -> None:
                nonlocal done
                done += count
                progress.line(name, view.name, done, len(view.task_ids), ran, count)

            results += run_view(
                view.task_ids,
                cache=cache,
                key=keys[view.name],
                view=view.name,
                runner=runner,
                batch=1 if is_harness(env_of[view.name]) else BATCH_TASKS,  # a harness plays one task at a time
                progress=step,
            )
    finally:
        if ood is not None:
            ood.close()
        if generator is not None:
            with output_to_file(log):
                generator.close()
            del generator
            gc.collect()  # free the engine's memory before the next snapshot's
    return results, {"wall_s": time.perf_counter() - started, "tasks_run": todo}


def _to_play(cfg, run_dir: Path, records, views, env_of, sampling) -> int:
    """Tasks the cache cannot answer, over every snapshot: what the time left is estimated for."""
    return sum(
        missing(
            {v.name: v.task_ids for v in views},
            ResultCache(run_dir / EVAL_DIR / "cache", r["name"]),
            _snapshot_keys(cfg, r, views, env_of, sampling),
        )
        for r in records
    )


def evaluate(args) -> int:
    run_dir = run_dir_arg(args.run_dir, "evaluate")
    cfg = load_run_config(run_dir, args.overrides)
    if args.limit is not None:
        if args.limit < 1:
            raise CliError("--limit must be >= 1")
        cfg.evaluation.limit, cfg.evaluation.view_limits = args.limit, {}
    eval_cfg = instantiate(cfg.evaluation)
    all_records = read_snapshots(run_dir)
    records = _chosen_snapshots(all_records, args.snapshots)
    names = [v for v in args.views.split(",") if v] if args.views else list(eval_cfg.views)
    sampling = eval_sampling(cfg, eval_cfg)
    t0 = time.perf_counter()
    with stdout_to_stderr(args.json):
        views, env_of, pool = _views(cfg, eval_cfg, all_records, names, TrainerConfig.of(cfg).groups_per_step)
        runnable = [v for v in views if v.unavailable is None]
        if not runnable:
            raise CliError("no view can be run: " + "; ".join(f"{v.name}: {v.unavailable}" for v in views))
        results, timings = [], {}
        progress = EvalProgress(_to_play(cfg, run_dir, records, runnable, env_of, sampling)).start()
        try:
            for record in records:  # one snapshot, one engine, at a time
                got, timings[record["name"]] = _run_snapshot(cfg, run_dir, record, runnable, env_of, sampling, progress)
                results += got
        finally:
            progress.stop()

    summary = _metrics(results, records, runnable)
    summary.update(_described(cfg, eval_cfg, all_records, records, views, env_of, pool, names))
    summary["evaluation"].update(wall_s=time.perf_counter() - t0, per_snapshot=timings)
    out = run_dir / EVAL_DIR
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    write_task_csv(results, out / "results.csv")
    if args.json:
        print(json.dumps(summary), file=result_stream())
    else:
        print_summary(summary, out)
    return 0


def _chosen_snapshots(records: list[dict[str, Any]], chosen: str | None) -> list[dict[str, Any]]:
    """The run's snapshots that --snapshots names (all without it), in the run's order."""
    if not chosen:
        return records
    wanted = [s for s in chosen.split(",") if s]
    known = [r["name"] for r in records]
    if unknown := [s for s in wanted if s not in known]:
        raise CliError(f"unknown snapshots {unknown}; the run has {known}")
    return [r for r in records if r["name"] in wanted]


def _metrics(results: list, records: list[dict[str, Any]], runnable) -> dict[str, Any]:
    """The summary's metrics: each view in the role it plays (validation, id, ood, replay)."""
    roles = {v.role: v.name for v in runnable}
    # The held-out-category view gives the OOD gain; without it, the first other OOD view (e.g. tau2_retail).
    ood = OOD_TEST if OOD_TEST in roles.values() else next((v.name for v in runnable if v.role == OOD_TEST), OOD_TEST)
    return summarize(
        results,
        [_snapshot_info(r) for r in records],
        validation_view=roles.get("validation", "validation"),
        id_view=roles.get("id", "id"),
        ood_view=ood,
        replay_view=roles.get("replay", "replay"),
    )


def _described(cfg, eval_cfg, all_records, records, views, env_of, pool, names: list[str]) -> dict[str, Any]:
    """What the summary records beside the metrics: the run's schedule, each view's size and env,
    the views that could not run and why, the harnesses' notes, the evaluation's settings."""
    trainer, learners = TrainerConfig.of(cfg), LearnerGroupConfig.of(cfg)  # the run's, typed
    runnable = [v for v in views if v.unavailable is None]
    sampling = eval_sampling(cfg, eval_cfg)
    validation = set(
        validation_task_ids(
            instantiate(cfg.env).task_ids("train"), eval_cfg.validation_size, eval_cfg.heldout_categories
        )
    )
    return {
        "schedule": schedule_record(
            eval_cfg.schedule,
            pool_size=len(pool()),
            groups_per_step=trainer.groups_per_step,
            rollouts=int(cfg.n),
            mini_batch_groups=learners.mini_batch_groups,
            steps=max(int(r["step"]) for r in all_records),
            snapshot_every=trainer.snapshot_every,
        ),
        "view_tasks": {
            v.name: {"role": v.role, "tasks": len(v.task_ids), "env": target_of(env_of[v.name], "env")}
            for v in runnable
        },
        "views_unavailable": {
            **unavailable_views(names),
            **{v.name: v.unavailable for v in views if v.unavailable},
        },
        "ood_harnesses": harness_notes(runnable, {r["name"]: str(r["weights"]) for r in records}),
        "evaluation": {
            "interface": "raw",
            "temperature": sampling.temperature,
            "max_new_tokens": sampling.max_new_tokens,
            "rollouts_per_task": 1,
            "seed": int(cfg.seed),
            "heldout_categories": list(eval_cfg.heldout_categories),
            "validation_size": eval_cfg.validation_size,
            # validation tasks that were in the training pool: 0 unless the run predates the split
            "validation_in_training_pool": len(validation & set(pool())),
        },
    }


def print_summary(summary: dict[str, Any], out: Path) -> None:
    stream = result_stream()
    views = list(summary["view_tasks"])
    sizes = ", ".join(f"{v} {info['tasks']} tasks" for v, info in summary["view_tasks"].items())
    print(f"evaluation (raw interface, greedy): {sizes}", file=stream)
    for v, why in summary["views_unavailable"].items():
        print(f"  view {v}: not available ({why})", file=stream)
    width = {v: max(12, len(v) + 2) for v in views}  # harness view names are long: keep columns apart
    print(f"{'snapshot':<10}" + "".join(f"{v:>{width[v]}}" for v in views), file=stream)
    for s in summary["snapshots"]:
        cells = [(v, summary["success"][s].get(v, {}).get("overall")) for v in views]
        print(
            f"{s:<10}" + "".join(f"{'n/a' if c is None else f'{100 * c:.1f}%':>{width[v]}}" for v, c in cells),
            file=stream,
        )

    for line in note_lines(summary.get("ood_harnesses", {})):
        print(f"  note: {line}", file=stream)
    print(
        f"best validation: {summary['best_validation']}; final: {summary['final']}; "
        f"wrote {out / 'summary.json'} and {out / 'results.csv'}",
        file=stream,
    )


def report(args) -> int:
    run_dir = run_dir_arg(args.run_dir, "report")
    source = run_dir / EVAL_DIR
    if not (source / "summary.json").is_file():
        raise FileNotFoundError(f"no evaluation in {run_dir}: run `seal evaluate {run_dir}` first")
    summary = json.loads((source / "summary.json").read_text())
    results = read_task_csv(source / "results.csv")
    metrics = run_dir / "metrics.jsonl"
    rounds = (
        [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    )
    path = write_report(summary, results, rounds, run_dir / REPORT_DIR)
    with open(path, "a") as f:  # what the generic report does not know: the run's schedule and view sizes
        f.write("\n## Schedule and views\n\n| field | value |\n|---|---|\n")
        for key, value in summary.get("schedule", {}).items():
            f.write(f"| {key} | {value} |\n")
        for view, info in summary.get("view_tasks", {}).items():
            f.write(f"| view `{view}` ({info['role']}) | {info['tasks']} tasks |\n")
        for view, why in summary.get("views_unavailable", {}).items():
            f.write(f"| view `{view}` | not available: {why} |\n")

        if notes := note_lines(summary.get("ood_harnesses", {})):
            f.write("\n## OOD harness views\n\n" + "".join(f"- {line}\n" for line in notes))
        overlap = summary.get("evaluation", {}).get("validation_in_training_pool")
        if overlap:  # the run trained without the validation split: its validation view is not held out
            f.write(f"\n**Warning:** {overlap} validation tasks were in the run's training pool.\n")
    print(f"wrote {path} and its plots in {path.parent}")
    return 0
