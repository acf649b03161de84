"""Every command line the README and docs/ show a user still parses, and every default a page
states is the code's: the fenced `seal ...`, `.venv/bin/...` and `bash ...` lines (a usage
synopsis's `[--flag VALUE]` included) name a subcommand and flags that exist, their ``key=value``
overrides compose against configs/, the scripts, files and tools they run exist; a config key a
page gives a default (`` `key` (default V) ``, `` `key=V` (default) ``, `` `key` ..., V by default ``,
the configuration reference's table) has that default in the composed config. Nothing runs."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from seal.commands.cli import build_parser
from seal.config import compose

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMPOSING = {"train", "plan", "rehearse", "rollout", "eval", "ablate", "bench", "env"}  # overrides composed as given
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|^\.\.\.$|<[^>]*>")  # RUN_DIR, TASK_ID, ..., <name>


def shown_commands(page: Path) -> list[tuple[int, str, list[str]]]:
    """(line, text, tokens from the program on) for every command a fenced block of ``page`` shows."""
    found, inside, pending = [], False, ""
    for number, raw in enumerate(page.read_text().splitlines(), start=1):
        line = raw.strip()
        if line.startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line, pending = (pending + " " + line).strip(), ""
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        for tokens in _segments(line.removeprefix("$ ")):
            start = next(
                (
                    i
                    for i, t in enumerate(tokens)
                    if t.startswith(".venv/bin/")
                    or (t in ("seal", "bash") and all("=" in x for x in tokens[:i]))  # after env assignments only
                ),
                None,
            )
            if start is not None:
                found.append((number, line, tokens[start:]))
    return found


def _segments(line: str) -> list[list[str]]:
    """The line's commands (split at &&, ; and a pipe outside quotes), as shell words."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in an output sample: whitespace is enough there
        words = line.split("#")[0].split()
    segments: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "|", ";", "||"):
            segments.append([])
        elif word.endswith(";"):
            segments[-1].append(word[:-1])
            segments.append([])
        else:
            segments[-1].append(word)
    return [s for s in segments if s]


def _synopsis(tokens: list[str]) -> list[str]:
    """A usage line's tokens as one example: brackets dropped, the first of each `a|b|c`."""
    out = []
    for t in tokens:
        t = t.strip("[]")
        if t and t not in ("...", "hydra", "overrides", "part", "options", "key=value"):
            out.append(t.split("|")[0])
    return out


@cache
def composes(overrides: tuple[str, ...]) -> str | None:
    try:
        compose(list(overrides))
    except ValueError as exc:
        return str(exc)
    return None


@cache
def default_config():
    return compose([])


def _parse(parser: argparse.ArgumentParser, tokens: list[str]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_known_args(tokens)
    except SystemExit:
        raise AssertionError(err.getvalue().strip().splitlines()[-1]) from None


def check_seal(tokens: list[str]) -> None:
    # A placeholder given to a flag (--limit K) stands for a value: any works, 1 also for a number.
    tokens = [
        "1" if i and tokens[i - 1].startswith("--") and PLACEHOLDER.fullmatch(t) else t for i, t in enumerate(tokens)
    ]
    args, extra = _parse(build_parser(), tokens)
    overrides = list(getattr(args, "overrides", []) or [])
    unknown = [e for e in extra if not ("=" in e and not e.startswith("-"))]
    assert not unknown, f"unrecognized arguments {unknown}"
    overrides += extra
    if args.command == "bench":
        from benchmarks.cli import PARTS
        from benchmarks.cli import build_parser as bench_parser

        if PLACEHOLDER.match(args.part):
            return
        assert args.part in (*PARTS, "all"), f"no bench part {args.part!r}"
        bench_args = bench_parser(args.part).parse_intermixed_args(args.bench_args)
        overrides = list(bench_args.overrides)
    if args.command == "scale":
        key, _, value = args.setting.partition("=")
        assert key in ("env", "generators") and (value.isdigit() or PLACEHOLDER.match(value)), args.setting
    real = [o for o in overrides if not any(PLACEHOLDER.search(part) for part in o.split("=", 1))]  # env=NAME
    if args.command in COMPOSING and real:
        assert composes(tuple(real)) is None, composes(tuple(real))
    if args.command == "evaluate":  # settings on a run's recorded config: keys it has
        for o in real:
            key = o.partition("=")[0].lstrip("+")
            assert OmegaConf.select(default_config(), key, default="__absent__") != "__absent__", key


def check_program(tokens: list[str]) -> None:
    program = tokens[0]
    if program == "bash":
        script = ROOT / tokens[1]
        assert script.is_file(), f"no script {tokens[1]}"
        text = script.read_text()
        flags = [t.split("=")[0] for t in tokens[2:] if t.startswith("--")]
        assert all(f in text for f in flags), f"{tokens[1]} takes none of {flags}"
        return
    name = program.removeprefix(".venv/bin/")
    if name == "seal":
        check_seal(tokens[1:])
        return
    assert (Path(sys.executable).parent / name).exists(), f"the environment has no {program}"
    if name == "python" and len(tokens) > 1:
        if tokens[1] == "-m" and tokens[2] == "pytest":
            paths = [t.split("::")[0] for t in tokens[3:] if t.startswith("tests/")]
            assert all((ROOT / p).exists() for p in paths), f"no such test path among {paths}"
        elif tokens[1] == "-c":
            compile(tokens[2], "<docs>", "exec")
        else:
            assert (ROOT / tokens[1]).is_file(), f"no such file {tokens[1]}"


COMMANDS = [
    pytest.param(tokens, id=f"{page.name}:{line}") for page in PAGES for line, _, tokens in shown_commands(page)
]


@pytest.mark.parametrize("tokens", COMMANDS)
def test_every_command_a_page_shows_parses(tokens):
    if tokens[0] in ("seal", ".venv/bin/seal") and any("[" in t for t in tokens):
        tokens = _synopsis(tokens)
    check_program(tokens)


# ------------------------------------------------------------------ defaults a page states
VALUE = r"([^\s`,;)]+)"


def stated_defaults(page: Path) -> list[tuple[str, str, str]]:
    """(key, stated value, the words that state it) for each default ``page`` gives a config key."""
    text = " ".join(page.read_text().split())
    key = r"`([a-z_]+(?:\.[a-z_0-9]+)+)"
    patterns = (
        key + r"(?:=[A-Z_]+)?` ?[^`.;(]{0,40}?\(default " + VALUE,  # `key` (default V / `key=K` (default V
        key + r"`, default " + VALUE,  # `key`, default V
        key + r"=([^\s`A-Z,;)]+)` \((?:[^)]{0,30} )?default\b",  # `key=v` (default) / (CPU default)
        key + r"=" + VALUE + r"`, also the [a-z ]{0,20}default\b",  # `key=V`, also the local default
        key + r"`[^`.;(]{0,60}?, " + VALUE + r" by default",  # `key` ..., V by default
        r"\| " + key + r"` \| `([^`]*)` \|",  # the configuration reference's table
    )
    return [(m[1], m[2], m[0]) for p in patterns for m in re.finditer(p, text)]


DEFAULTS = [
    pytest.param(key, value, words, id=f"{page.name}:{key}")
    for page in PAGES
    for key, value, words in stated_defaults(page)
]


@pytest.mark.parametrize(("key", "value", "words"), DEFAULTS)
def test_every_default_a_page_states_is_the_codes(key, value, words):
    actual = OmegaConf.select(default_config(), key, default="__absent__")
    if actual == "__absent__" or isinstance(actual, (dict, list)) or OmegaConf.is_config(actual):
        pytest.skip(f"{key} is not a setting of the default config")  # another group's (e.g. vllm_cpu's)
    stated = yaml.safe_load(value.rstrip("."))
    assert stated == actual or str(stated) == str(actual), f"{words!r}: the default is {actual!r}"


def named_files(page: Path) -> list[str]:
    """Repository files ``page`` names by path (tests/unit/..., scripts/..., configs/...)."""
    tops = "|".join(sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")))
    path = re.compile(rf"(?<![\w/.<-])((?:{tops})/[\w./-]*\w\.(?:py|sh|md|yaml|txt|json|toml|ini))\b")
    return [m[1] for m in path.finditer(page.read_text())]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_a_page_names_exists(page):
    missing = [name for name in named_files(page) if not (ROOT / name).exists()]
    assert not missing, f"{page.name} names files that are not in the repository: {missing}"


def test_the_walk_finds_the_commands_and_defaults():
    """The walk itself: the README's two commands, a synopsis, an output sample's command, defaults."""
    readme = [" ".join(t) for _, _, t in shown_commands(ROOT / "README.md")]
    assert readme[:3] == ["bash scripts/setup.sh", ".venv/bin/seal train", "bash scripts/test.sh"]
    assert len(COMMANDS) > 40 and len(DEFAULTS) > 20
    assert "tests/unit/repo/test_requirements.py" in named_files(ROOT / "docs" / "getting-started.md")
    with pytest.raises(AssertionError, match="trainer.stepz is not a config key"):
        check_seal(["train", "trainer.stepz=2"])
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        check_seal(["eval", "--limt", "2"])
    with pytest.raises(AssertionError, match="no such file"):
        check_program([".venv/bin/python", "benchmarks/nope.py"])
