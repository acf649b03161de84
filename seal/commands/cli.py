"""The `seal` command. Imports stay inside handlers so `seal --help` is instant."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from seal.commands.parsers import COMMANDS
from seal.console import engine_output_to_stderr
from seal.errors import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seal", description="SEAL: asynchronous GRPO for tool-use agents with a co-evolving training interface."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:  # one per command module (seal/commands/parsers.py)
        add_command(sub)
    return parser


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
        engine_output_to_stderr()
    module_name, func_name = args.handler.split(":")

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
