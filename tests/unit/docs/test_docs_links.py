"""README.md is the front door and docs/ holds the rest: every relative link in them points at a
file in this repository (and at a heading there, when it names one), the README stays short with
the two commands as its first code block, and its layout section names exactly the top-level
folders that hold code or config. Pure file reading: no imports of the project, no subprocess."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) or [text](target "title"); the text may span lines. Images (![alt](x)) match too.
INLINE_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
EXTERNAL = re.compile(r"^(https?:|mailto:)", re.IGNORECASE)
FIRST_COMMANDS = ["bash scripts/setup.sh && .venv/bin/seal train", "bash scripts/test.sh"]
# The top-level folders the layout must name (more are found below: any folder with code or config).
REQUIRED_DIRS = {
    "weights",
    "rollout",
    "actors",
    "learner",
    "env_pool",
    "replay",
    "evaluation",
    "seal",
    "configs",
    "benchmarks",
    "tests",
    "scripts",
    "requirements",
    "docs",
}
CODE_SUFFIXES = {".py", ".yaml", ".yml", ".sh", ".txt", ".toml", ".cfg", ".ini", ".json", ".md"}


def is_fence(line: str) -> bool:
    return line.lstrip().startswith(("```", "~~~"))


def prose(text: str) -> str:
    """The text outside fenced code blocks (fence lines blanked, so line numbers stay put) with inline
    code spans kept as plain words: links are neither read from code nor hidden by backticks."""
    out, fenced = [], False
    for line in text.split("\n"):
        if is_fence(line):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return re.sub(
        r"(`+)(.+?)\1", lambda m: m.group(2).replace("[", "(").replace("]", ")"), "\n".join(out), flags=re.DOTALL
    )


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every inline link and reference definition on the page."""
    text = prose(page.read_text())
    found = [(m.start(2), m.group(2)) for m in INLINE_LINK.finditer(text)]
    found += [(m.start(1), m.group(1)) for m in REFERENCE_DEF.finditer(text)]
    return sorted((text.count("\n", 0, pos) + 1, target) for pos, target in found)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().split("\n"):
        if is_fence(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = unquote(target).partition("#")
    base = ROOT if path.startswith("/") else page.parent  # GitHub reads /x as the repository's x
    return (base / path.lstrip("/")).resolve(), anchor


def test_the_pages_exist():
    assert README.is_file()
    assert len(PAGES) > 1, "docs/ holds no pages"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page):
    bad = []
    for line, target in links(page):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path, _ = resolve(page, target)
        if not path.is_relative_to(ROOT):
            bad.append(f"line {line}: {target} points outside the repository ({path})")
        elif not path.exists():
            bad.append(f"line {line}: {target} does not exist ({path})")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_anchor_names_a_heading(page):
    bad = []
    for line, target in links(page):
        if EXTERNAL.match(target) or "#" not in target:
            continue
        path, anchor = resolve(page, target)
        if path.suffix == ".md" and path.is_file() and path.is_relative_to(ROOT) and anchor not in anchors(path):
            bad.append(f"line {line}: {target}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_link_checker_catches_a_missing_file_and_an_escape(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        '[a](../README.md) [b](docs/none.md#x) ![c](img.png "t")\n'
        "`[not](a-link.md)`\n```\n[nor](this.md)\n```\n[ref]: ../../outside.md\n"
    )
    assert [t for _, t in links(page)] == ["../README.md", "docs/none.md#x", "img.png", "../../outside.md"]
    assert not resolve(README, "../elsewhere/notes.md")[0].is_relative_to(ROOT)
    assert resolve(ROOT / "docs" / "x.md", "../README.md")[0] == README
    assert slug("The main job: `seal train`") == "the-main-job-seal-train"
    assert slug("`seal train recipe=...`") == "seal-train-recipe"


def test_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) < 250, f"README.md has {len(text.splitlines())} lines: move detail to docs/"
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if is_fence(line))
    end = next(i for i in range(start + 1, len(lines)) if is_fence(lines[i]))
    commands = [line.split("#")[0].strip() for line in lines[start + 1 : end] if line.split("#")[0].strip()]
    assert commands == FIRST_COMMANDS, lines[start : end + 1]


def layout_section() -> list[str]:
    lines = README.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if re.match(r"##\s+Layout\b", line))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"#{1,2}\s", lines[i])), len(lines))
    return lines[start + 1 : end]


def named_dirs() -> set[str]:
    """The folders the layout section names: a line that starts with `name/`."""
    return {m.group(1) for line in layout_section() if (m := re.match(r"`?([A-Za-z0-9_][\w.-]*)/`?(?:\s|$)", line))}


def ignored(name: str) -> bool:
    gitignore = ROOT / ".gitignore"
    patterns = gitignore.read_text().split("\n") if gitignore.is_file() else []
    for pattern in patterns:
        pattern = pattern.strip().strip("/")
        if pattern and not pattern.startswith("#") and "/" not in pattern and fnmatch.fnmatch(name, pattern):
            return True
    return False


def holds_code(folder: Path) -> bool:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        if any(Path(f).suffix in CODE_SUFFIXES for f in filenames):
            return True
    return False


def code_dirs() -> set[str]:
    """Top-level folders with code or config: not hidden, not ignored by git, not links."""
    return {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir()
        and not p.is_symlink()
        and not p.name.startswith((".", "_"))
        and not p.name.endswith(".egg-info")
        and not ignored(p.name)
        and holds_code(p)
    }


def test_the_layout_names_every_top_level_folder_with_code():
    named = named_dirs()
    missing = (REQUIRED_DIRS | code_dirs()) - named
    assert not missing, f"README.md's layout section does not name {sorted(missing)}"


def test_every_folder_the_layout_names_exists():
    named = named_dirs()
    assert named, "README.md's layout section names no folder (lines starting with `name/`)"
    gone = sorted(name for name in named if not (ROOT / name).is_dir())
    assert not gone, f"README.md's layout section names folders that do not exist: {gone}"
