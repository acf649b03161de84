"""`seal train`: the main job, the actor-learner pipeline on Ray (seal/run/pipeline.py).

Writes a run directory: config.yaml (resolved), run.json (overrides, seed,
code version), metrics.jsonl, rounds.jsonl (per-round failure profile and
interface state), tensorboard/, checkpoints/latest, control.json while it runs,
and at the end summary.txt (the closing note it prints) and training_curves.png.
Progress is one line per event (seal/run/progress.py); --quiet prints only errors
and the closing note's first line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from omegaconf import OmegaConf

from evaluation.frozen import read_final
from seal.commands.preflight import one_line, preflight
from seal.errors import CliError
from seal.run.final_eval import run_final_evaluation
from seal.run.pipeline import Pipeline
from seal.run.plot import plot_training
from seal.run.progress import Progress
from seal.run.run_dir import create_run_dir, forget_start
from seal.run.snapshots import read_snapshots
from seal.run.summary import CURVES_FILE, SUMMARY_FILE, summary_text
from seal.run.task_fit import select_tasks
from seal.runtime.control import send_control


def run(args) -> int:
    quiet = bool(getattr(args, "quiet", False))
    progress = Progress(quiet=quiet)  # its clock starts with the command

    # Every config error is one line here, before a run directory or Ray exists.
    cfg, settings = preflight(args.overrides)  # the typed groups, built once: the run reads these
    if getattr(args, "cfg", False):
        print(OmegaConf.to_yaml(cfg, resolve=True), end="")
        return 0
    if quiet:
        _quiet_logs()
    progress.emit(
        "tasks", "checking which tasks' opening prompts fit the model's context (the tokenizer: a few seconds)"
    )
    tasks = _select_tasks(cfg)  # "no task fits" is one line, still before any side effect
    progress.emit(
        "tasks",
        f"{len(tasks[0])} tasks"
        + (
            f"; skipping {tasks[1]} whose opening prompt does not fit the model's context ({cfg.generator.max_model_len} tokens "
            f"with {cfg.sampling.max_new_tokens} to answer; trainer.skip_overlong=false keeps them)"
            if tasks[1]
            else ""
        ),
    )

    trainer = settings.trainer
    resume = Path(cfg.resume) if cfg.resume else None
    wanted = resume or (Path(cfg.run_dir) if cfg.run_dir else None)
    was_empty = wanted is None or not wanted.exists() or not any(wanted.iterdir())
    run_dir = create_run_dir(str(wanted) if wanted else None, cfg, list(args.overrides))
    lc = settings.learner.cfg
    learner = f"ZeRO-{lc.zero_stage}" if lc.backend == "deepspeed" else "torch"
    progress.emit(
        "run",
        f"{run_dir}: mode={trainer.mode} env={cfg.env._target_.rsplit('.', 1)[-1]} model={settings.model.path} "
        f"learner={learner} env_actors={cfg.cluster.env_actors}; {trainer.steps} steps x "
        f"{trainer.groups_per_step} groups/step x {cfg.n} rollouts",
    )
    try:
        pipeline = Pipeline(cfg, run_dir, resume, progress=progress, tasks=tasks, settings=settings)
    except BaseException:
        forget_start(run_dir, was_empty and resume is None)
        raise
    try:
        if resume is not None:
            progress.emit("run", f"resumed at step {pipeline.state.step}, policy version {pipeline.state.version}")
        progress.emit("run", f"scale env actors while it runs: .venv/bin/seal scale {run_dir} env=N")
        first = pipeline.state.step
        pipeline.run(trainer.steps)
        steps_done = pipeline.state.step - first
    finally:
        pipeline.close()

    run_final_evaluation(cfg, run_dir, progress.emit)
    text = close_run(run_dir, time.monotonic() - progress.started, steps_done, bool(trainer.checkpoint_every))
    if quiet:  # the one line a script needs
        print(text.splitlines()[0], flush=True)
    else:
        print("\n" + text, end="", flush=True)
    return 0


def _quiet_logs() -> None:
    """--quiet: errors only. Ray reads its driver log level when first imported (not yet, here)."""
    os.environ.setdefault("RAY_LOGGER_LEVEL", "error")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger().setLevel(logging.ERROR)


def _select_tasks(cfg) -> tuple[list[str], int]:
    try:
        return select_tasks(cfg)
    except ValueError as exc:
        raise CliError(one_line(exc)) from None


def close_run(run_dir: Path, wall_s: float, steps_now: int, checkpoint: bool) -> str:
    """The closing note (seal/run/summary.py) over every step in metrics.jsonl, written to
    RUN_DIR/summary.txt beside the training curves' PNG."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    curves = True
    try:
        plot_training(rows, run_dir / CURVES_FILE)
    except Exception as exc:  # a plot must not turn a finished run into a failed one
        logging.getLogger(__name__).error("could not draw %s: %s", CURVES_FILE, exc)
        curves = False
    text = summary_text(
        rows,
        run_dir,
        wall_s,
        read_snapshots(run_dir),
        checkpoint=checkpoint,
        curves=curves,
        steps_now=steps_now,
        final=read_final(run_dir),
    )
    (run_dir / SUMMARY_FILE).write_text(text)
    return text


def scale(args) -> int:
    reply = send_control(Path(args.run_dir), "scale", {args.what: args.count})
    if not reply.get("ok"):
        raise ValueError(reply.get("error", "refused"))
    print(f"env actors: {reply['env_actors']}, generator replicas: {reply['generators']}")
    return 0
