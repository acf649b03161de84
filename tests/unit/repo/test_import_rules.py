"""The import rules of docs/layout.md, read from the code itself (every import, a function's own
included): which component may import which, no import circle between modules, and no file over
500 lines. A new import that breaks a rule fails here with the line that made it."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# Each component and the components it may import (itself always). Shared packages sit low:
# weights/ (learner and generators), rollout/ (env actors and evaluation), replay/ (wire types).
MAY_IMPORT: dict[str, set[str]] = {
    "weights": set(),
    "families": set(),  # model families: their templates, end tokens, tool formats, reasoning
    "replay": set(),
    "env_pool": set(),
    "rollout": {"weights", "families", "replay", "env_pool"},
    "learner": {"weights", "families", "replay", "env_pool"},
    "actors": {"weights", "families", "replay", "env_pool", "rollout"},
    "evaluation": {"weights", "families", "replay", "env_pool", "rollout"},
    "seal": {"weights", "families", "replay", "env_pool", "rollout", "learner", "actors", "evaluation"},
    "benchmarks": {"weights", "families", "replay", "env_pool", "rollout", "learner", "actors", "evaluation", "seal"},
    # A user's environment (docs/custom-environment.md) needs the env contract and nothing else.
    "examples": {"env_pool"},
}
# Inside seal/: commands wire run and runtime; a run drives the runtime; the runtime knows neither.
# The estimator (what a configuration asks) sits below them all: the runtime checks the live cluster
# against it, and it knows none of them.
SEAL_WINGS_MAY_IMPORT: dict[str, set[str]] = {
    "seal.commands": {"seal.run", "seal.runtime", "seal.estimate"},
    "seal.run": {"seal.runtime", "seal.estimate"},
    "seal.runtime": {"seal.estimate"},
    "seal.estimate": set(),
}
MAX_LINES = 500


def _source_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in listed.stdout.split() if p.split("/")[0] in MAY_IMPORT]


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, our module) for every import in the file; ``from a import b`` counts as a.b when
    a.b is a module."""
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # a.b.Name -> a.b
                name = name.rpartition(".")[0]
            if name and name != me:
                found.append((node.lineno, name))
    return found


def _graph() -> dict[str, list[tuple[int, str]]]:
    files = _source_files()
    modules = {_module_of(p) for p in files}
    return {_module_of(p): _imports(p, modules) for p in files}


def _wing(module: str) -> str | None:
    return next((w for w in SEAL_WINGS_MAY_IMPORT if module == w or module.startswith(w + ".")), None)


def _file(module: str) -> str:
    path = ROOT / (module.replace(".", "/") + ".py")
    return str((path if path.exists() else ROOT / module.replace(".", "/") / "__init__.py").relative_to(ROOT))


def test_components_import_only_what_sits_below_them():
    broken = []
    for module, imports in _graph().items():
        mine = module.split(".")[0]
        for line, target in imports:
            theirs = target.split(".")[0]
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                broken.append(
                    f"{_file(module)}:{line} imports {target} ({mine}/ may import {sorted(MAY_IMPORT[mine]) or 'nothing of ours'})"
                )
    assert not broken, "\n".join(broken)


def test_seal_wings_import_downwards_and_top_level_seal_imports_no_wing():
    broken = []
    for module, imports in _graph().items():
        if not module.startswith("seal"):
            continue
        wing = _wing(module)
        allowed = SEAL_WINGS_MAY_IMPORT[wing] | {wing} if wing else set()
        for line, target in imports:
            theirs = _wing(target)
            if theirs is not None and theirs not in allowed:
                broken.append(
                    f"{_file(module)}:{line} imports {target} ({wing or module} may import {sorted(allowed) or 'no wing'})"
                )
    assert not broken, "\n".join(broken)


def test_no_import_circle():
    graph = {m: sorted({t for _, t in imports}) for m, imports in _graph().items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_file_over_500_lines():
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    long = []
    for name in listed:
        path = ROOT / name
        try:
            lines = path.read_text().count("\n")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (the figures) have no lines to read
        if lines > MAX_LINES:
            long.append(f"{name}: {lines} lines")
    assert not long, f"files over {MAX_LINES} lines:\n" + "\n".join(long)


@pytest.mark.parametrize("rule", ["learner/ imports actors/", "actors/ imports learner/"])
def test_the_rules_catch_a_sibling_import(rule, tmp_path):
    """The checker itself: a sibling import in a made-up file is reported."""
    source, target = ("learner", "actors") if rule.startswith("learner") else ("actors", "learner")
    fake = tmp_path / source / "x.py"
    fake.parent.mkdir()
    fake.write_text(f"def f():\n    from {target}.env_actor import EnvActor\n")
    modules = {f"{source}.x", f"{target}.env_actor"}
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        imports = _imports(fake, modules)
    finally:
        ROOT = old
    assert imports == [(2, f"{target}.env_actor")]
    assert target not in MAY_IMPORT[source]
