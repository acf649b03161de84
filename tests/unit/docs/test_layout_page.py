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


def trail_hops(text: str) -> list[tuple[str, str]]:
    """(file, qualified name) of each hop in the fenced blocks under '## Follow one trajectory ...'."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("## Follow one trajectory"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    hops, inside = [], False
    for line in lines[start:end]:
        if line.startswith("```"):
            inside = not inside
        elif inside and line.strip():
            match = re.match(r"([\w/]+\.py):([\w.]+)\s", line)
            assert match, f"docs/layout.md trail line is not 'file.py:function  what': {line!r}"
            hops.append((match[1], match[2]))
    return hops


def defined(path: Path, qualname: str) -> bool:
    """Whether ``qualname`` (``f`` or ``Class.method``) is defined at that place in ``path``."""
    import ast

    body = ast.parse(path.read_text()).body
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            ),
            None,
        )
        if node is None:
            return False
        body = node.body
    return True


def test_every_hop_of_the_trail_exists():
    hops = trail_hops(PAGE.read_text())
    assert len(hops) >= 20, hops
    missing = [f"{f}:{q}" for f, q in hops if not (ROOT / f).is_file() or not defined(ROOT / f, q)]
    assert not missing, f"docs/layout.md's trail names what the code no longer has: {missing}"


def test_the_trail_reader_catches_a_renamed_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    async def go(self):\n        pass\n\ndef f():\n    pass\n")
    assert defined(module, "A.go") and defined(module, "f")
    assert not defined(module, "A.gone") and not defined(module, "g") and not defined(module, "f.x")
    page = "## Follow one trajectory\n```\nm.py:A.go      one\nm.py:f  two\n```\n## Next\n```\nx.py:g  no\n```\n"
    assert trail_hops(page) == [("m.py", "A.go"), ("m.py", "f")]
