"""`seal bench PART [--json] [--repeats R] [--out DIR] [part options] [hydra overrides...]`

Parts (one module each, benchmarks/bench_*.py):
  rollout-learn  each stage alone vs inside the running pipeline
  sync-async     the same config in sync and async mode: step times, overlap, speedup vs ideal
  env            env pool scaling with 1, 2, 4, 8 actors (ground-truth replay instead of a generator)
  transport      ZeroMQ + msgpack trajectory path vs multiprocessing / in-process queues
  weights        publish -> first token at the new version vs model size, against a memory copy
  precision      fp32 vs bf16: generator tokens/s, learner tokens/s, a toy- and a BFCL-shaped step
  trl            TRL's GRPOTrainer vs our pipeline on the same work (needs requirements/bench.txt)
  learner-scale  the same global batch on 1 and 2 learner ranks: samples/s, comm share, peak memory per rank
  learner        one learner step by phase; FLOP/s against the bf16 matmul peak; --baseline: another commit side by side
  generator      blocking vs continuous batching on uneven multi-turn episodes; 1 vs 2 replicas; update latency per mode
  reference      LoRA's KL reference from the generator's prompt log-probs vs the learner's forward: gap and seconds
  all            every part in turn, defaults plus the given options and overrides

Each part prints a table (or, with --json, one JSON object per part on
stdout, everything else on stderr), writes bench_<part>.json and
bench_<part>.png under --out, and records the outside CPU load. Hydra
overrides (model=tiny, learner=torch, n=4, ...) go to the parts that run the
pipeline or its actors (rollout-learn, sync-async, weights, trl).

    .venv/bin/seal bench sync-async --repeats 3 model=embedded
    .venv/bin/python benchmarks/cli.py env --actors 1,2,4,8 --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable as `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PARTS = {
    "rollout-learn": "bench_rollout_learn",
    "sync-async": "bench_sync_async",
    "env": "bench_env",
    "transport": "bench_transport",
    "weights": "bench_weights",
    "precision": "bench_precision",
    "trl": "bench_trl",
    "learner-scale": "bench_learner_scale",
    "generator": "bench_generator",
    "learner": "bench_learner",
    "reference": "bench_reference",
}
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _module(part: str):
    return importlib.import_module(f"benchmarks.{PARTS[part]}")


def build_parser(part: str) -> argparse.ArgumentParser:
    # `all` takes every part's options; the parts share --steps and --warmup (same defaults): the last definition serves.
    parser = argparse.ArgumentParser(
        prog=f"seal bench {part}",
        conflict_handler="resolve",
        description=(_module(part).__doc__ or "").splitlines()[0] if part in PARTS else "every benchmark part in turn",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per part on stdout")
    parser.add_argument("--repeats", type=int, default=3, help="repeated measurements (median and min..max reported)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for bench_<part>.json and .png")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    for name in PARTS if part == "all" else [part]:
        _module(name).add_arguments(parser)
    parser.add_argument(
        "overrides", nargs="*", help="hydra overrides for the pipeline parts, e.g. model=tiny learner=torch"
    )
    return parser


def run_part(part: str, args: argparse.Namespace) -> dict:
    from benchmarks._common import LoadProbe, log, machine, write_json
    from seal.console import results, stdout_to_stderr

    module = _module(part)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    with stdout_to_stderr(args.json):
        with LoadProbe() as probe:
            result = module.run(args)
        report = {
            "part": part,
            **result,
            "command": " ".join(["seal bench", part, *args.command_line]),
            "repeats_requested": args.repeats,
            "started": started,
            "outside_load": probe.result,
            "machine": machine(),
        }
        path = write_json(args.out, part, report)
        if not args.no_plot:
            report["plot"] = str(module.plot(report, args.out))
            write_json(args.out, part, report)
        log(f"wrote {path}")
    out = results()  # stdout, apart from what the engines print (seal/console.py)
    if args.json:
        print(json.dumps(report, default=str), file=out, flush=True)
    else:
        print(f"== {part} ==", file=out)
        print(module.render(report), file=out)
        for t in report.get("targets", []):
            state = "met" if t["met"] else ("not met" if t["met"] is False else "not measured")
            print(f"target: {t['name']} {t['target']}: measured {_short(t['measured'])} ({state})", file=out)
        load = report["outside_load"]
        print(
            f"outside load: loadavg {load['loadavg_before'][0]} -> {load['loadavg_after'][0]} on {load['cpus']} cores; "
            f"other processes used {load['other_processes_cpu_share']:.0%} of the machine's CPU during the run",
            file=out,
        )
        print(f"JSON: {path}" + (f"; plot: {report['plot']}" if "plot" in report else ""), file=out)
    return report


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    part, rest = argv[0], argv[1:]
    if part not in (*PARTS, "all"):
        raise ValueError(f"unknown benchmark part {part!r}; choose from {', '.join([*PARTS, 'all'])}")
    args = build_parser(part).parse_intermixed_args(rest)
    if getattr(args, "warmup", 1) < 1:
        raise ValueError("--warmup must be >= 1: the first step also pays for start-up")
    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    args.command_line = rest
    if part != "all":
        run_part(part, args)
        return 0
    failed = []
    for name in PARTS:  # one part failing (e.g. TRL not installed) does not cost the others
        try:
            run_part(name, args)
        except Exception as exc:  # reported, and the exit status says so
            print(f"seal bench: {name} failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0


def run(cli_args) -> int:
    """Handler of `seal bench` (seal/commands/cli.py): the part and everything after it."""
    return main([cli_args.part, *cli_args.bench_args])


if __name__ == "__main__":
    sys.exit(main())
