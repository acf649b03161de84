"""Every `seal` command's --help says what it writes: a "Writes:" sentence naming the files, or
"Writes: nothing"; and the lists in the help follow the code they name."""

from __future__ import annotations

import argparse
import re

from seal.commands.cli import build_parser


def leaf_commands(parser: argparse.ArgumentParser, prefix: str = "seal") -> dict[str, argparse.ArgumentParser]:
    """Every runnable command, nested ones (`seal env show`) included, by its full name."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix: parser}
    leaves: dict[str, argparse.ArgumentParser] = {}
    for name, child in subs[0].choices.items():
        leaves.update(leaf_commands(child, f"{prefix} {name}"))
    return leaves


def test_every_command_help_names_what_it_writes():
    leaves = leaf_commands(build_parser())
    assert len(leaves) >= 15, sorted(leaves)
    missing = [name for name, p in leaves.items() if not re.search(r"\bWrites:", " ".join(p.format_help().split()))]
    assert not missing, f"no 'Writes:' sentence in the --help of {missing}"


def test_commands_that_write_files_name_them():
    leaves = leaf_commands(build_parser())
    helps = {name: " ".join(p.format_help().split()) for name, p in leaves.items()}
    expected = {
        "seal train": ["metrics.jsonl", "summary.txt", "training_curves.png", "snapshots/"],
        "seal rehearse": ["rehearsal.json", "rehearsal.txt"],
        "seal evaluate": ["summary.json", "results.csv", "evaluate.log"],
        "seal report": ["report.md"],
        "seal ablate": ["ablation.md", "ablation.json", "curves.md", "curves.png"],
        "seal bench": ["bench_<part>.json", "bench_<part>.png"],
        "seal rollout": ["--out"],
        "seal model prepare": ["SEAL_CACHE"],
    }
    for name, files in expected.items():
        written = helps[name].split("Writes:", 1)[1]
        assert all(f in written for f in files), (name, files, written)


def test_the_file_names_in_the_help_are_the_ones_the_code_writes():
    from seal.commands.evaluate import ENGINE_LOG, EVAL_DIR, REPORT_DIR
    from seal.commands.rehearse_report import REPORT_JSON, REPORT_TEXT
    from seal.run.summary import CURVES_FILE, SUMMARY_FILE

    helps = {n: " ".join(p.format_help().split()) for n, p in leaf_commands(build_parser()).items()}
    assert SUMMARY_FILE in helps["seal train"] and CURVES_FILE in helps["seal train"]
    assert REPORT_JSON in helps["seal rehearse"] and REPORT_TEXT in helps["seal rehearse"]
    assert f"RUN_DIR/{EVAL_DIR}/" in helps["seal evaluate"] and ENGINE_LOG in helps["seal evaluate"]
    assert f"RUN_DIR/{REPORT_DIR}/" in helps["seal report"]


def test_seal_help_lists_every_bench_part():
    from benchmarks.cli import PARTS
    from seal.commands.parsers import BENCH_PARTS

    assert BENCH_PARTS == tuple(PARTS)
    top = " ".join(build_parser().format_help().split())
    bench_line = top.split("bench ", 1)[1]
    assert all(part in bench_line for part in PARTS), bench_line


def test_seal_env_interface_help_lists_every_component():
    from env_pool.interface.state import COMPONENTS

    for name in ("seal env replay-gt", "seal env show"):
        text = " ".join(leaf_commands(build_parser())[name].format_help().split())
        assert all(c in text for c in COMPONENTS), (name, text)
