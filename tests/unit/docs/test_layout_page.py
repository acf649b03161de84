"""docs/layout.md's module tree is the code's: every Python module of the packages is listed at
its place (folders end in /, two spaces of indent a level) and everything listed exists, so the
page cannot drift from the tree."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "layout.md"
PACKAGES = ("weights", "rollout", "replay", "env_pool", "actors", "learner", "evaluation", "seal", "benchmarks")


def listed_paths(text: str) -> list[str]:
    """Paths of the fenced tree under the '## Modules' heading: 'name/' opens a folder one level
    deeper, 'name.py' is a module; what follows two or more spaces is the description."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if re.match(r"##\s+Modules\b", line))
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    stack: list[str] = []
    paths = []
    for number, line in enumerate(lines[fence + 1 : end], fence + 2):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0 and indent // 2 <= len(stack), f"docs/layout.md line {number}: indent {indent}"
        name = line.strip().split("  ")[0].strip()
        stack = stack[: indent // 2]
        paths.append("/".join(stack + [name.rstrip("/")]) + ("/" if name.endswith("/") else ""))
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
    return paths


def modules_in_tree() -> set[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {p for p in out.split() if p.split("/")[0] in PACKAGES and not p.endswith("__init__.py")}


def test_the_page_lists_every_module_and_nothing_else():
    paths = listed_paths(PAGE.read_text())
    modules = {p for p in paths if p.endswith(".py")}
    missing = sorted(modules_in_tree() - modules)
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/layout.md does not list {missing}"
    assert not gone, f"docs/layout.md lists what does not exist: {gone}"


def test_the_tree_reader_follows_indentation():
    page = "## Modules\n```\na/        top\n  b.py    one\n  c/\n    d.py  two\ne/\n```\n"
    assert listed_paths(page) == ["a/", "a/b.py", "a/c/", "a/c/d.py", "e/"]
