"""`seal chaos [--minutes M] [--seed S] [--mean-gap-s G | --one-each] [--out DIR] [--json] [overrides...]`

Runs the real `seal train` pipeline (toy env, tiny model, async, 2 env actors, the torch learner) for
M minutes under a seeded random fault schedule (benchmarks/chaos/schedule.py), restarting it with
resume=RUN_DIR whenever a fault ends it, then resumes it once more to finish on its own. Prints the
report's table (benchmarks/chaos/report.py) and writes chaos.json under --out. Needs root: the run's
storage is a tmpfs it mounts (and removes) so that disk_full is a real full filesystem.

    .venv/bin/seal chaos --minutes 60 --seed 47
    .venv/bin/seal chaos --minutes 4 --one-each --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.chaos.report import raw, render, summarise
from benchmarks.chaos.schedule import KINDS, one_each, random_schedule
from benchmarks.chaos.soak import Soak


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seal chaos", description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--minutes",
        type=float,
        default=60.0,
        help="wall-clock bound of the faulted run (--one-each: ends sooner once done)",
    )
    p.add_argument("--seed", type=int, default=47, help="the fault schedule's seed (recorded)")
    p.add_argument("--mean-gap-s", type=float, default=60.0, help="mean seconds between faults (random schedule)")
    p.add_argument(
        "--steady-tail-min",
        type=float,
        default=0.0,
        help="last minutes with no run-ending fault and kills of the youngest process of a kind, so the "
        "oldest of each kind lives through them and its memory growth is measured (random schedule)",
    )
    p.add_argument("--one-each", action="store_true", help="every fault kind once, in a seeded order, --gap-s apart")
    p.add_argument("--gap-s", type=float, default=15.0, help="seconds between faults with --one-each")
    p.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated")
    p.add_argument("--replicas", type=int, default=1, help="generator replicas")
    p.add_argument("--checkpoint-every", type=int, default=5, help="learner steps between checkpoints")
    p.add_argument(
        "--out", type=Path, default=None, help="folder for the run, the logs and chaos.json (default: a temp dir)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--report", type=Path, default=None, help="print the report of a soak's raw.json again; run nothing")
    p.add_argument("overrides", nargs="*", help="more hydra overrides for the run")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.report:  # the report again from a soak's raw.json
        print(render(summarise(json.loads(args.report.read_text()))))
        return 0
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}")
    duration_s = args.minutes * 60
    schedule = (
        one_each(args.seed, args.gap_s, kinds)
        if args.one_each
        else random_schedule(args.seed, duration_s, args.mean_gap_s, kinds, args.steady_tail_min * 60)
    )
    if args.one_each and args.steady_tail_min:
        raise ValueError("--steady-tail-min shapes the random schedule; --one-each has none")
    if not 0 <= args.steady_tail_min < args.minutes:
        raise ValueError(f"--steady-tail-min {args.steady_tail_min} must lie in [0, --minutes {args.minutes})")
    out = args.out or Path(tempfile.mkdtemp(prefix="seal-chaos-"))
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} is not empty: a soak starts a run of its own")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    soak = Soak(
        out,
        schedule,
        duration_s,
        replicas=args.replicas,
        checkpoint_every=args.checkpoint_every,
        extra_overrides=list(args.overrides),
        until_done=args.one_each,
        steady_from_s=duration_s - args.steady_tail_min * 60 if args.steady_tail_min else None,
    )
    with soak:
        soak.run()
        recorded = raw(soak)  # read from the tmpfs before it goes
        recorded.update(seed=args.seed, command="seal chaos " + " ".join(argv))  # for --report
    (out / "raw.json").write_text(json.dumps(recorded, default=str))
    report = summarise(recorded)
    report.update(
        seed=args.seed,
        started=started,
        command="seal chaos " + " ".join(argv),
        schedule=[f.to_dict() for f in schedule],
        steady_tail_min=args.steady_tail_min,
        processor=_processor(),
    )
    (out / "chaos.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, default=str) if args.json else render(report) + f"\nJSON: {out / 'chaos.json'}")
    shutil.rmtree(soak.mount, ignore_errors=True)
    g = report["groups"]
    clean = report["completed"] and not g.get("groups_lost") and not g.get("groups_trained_twice")
    return 0 if clean and report["storage"]["all_load"] else 1


def _processor() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
    )
    return f"{model}, {os.cpu_count()} cores"


def run(cli_args) -> int:
    """Handler of `seal chaos` (seal/commands/cli.py)."""
    return main(list(cli_args.chaos_args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
