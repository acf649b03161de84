"""Drift a re-audit of the docs found, held to the code: the envs and their step limits the
environments page states, the interface components a synopsis lists, the path an env outside
SEAL's packages needs wherever a page shows it, and what scripts/test.sh runs first."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ENV_CONFIGS = sorted((ROOT / "configs" / "env").glob("*.yaml"))


def flat(page: Path) -> str:
    return " ".join(page.read_text().split())


def test_the_environments_page_names_every_env_and_its_step_limit():
    text = flat(ROOT / "docs" / "environments.md")
    for config in ENV_CONFIGS:
        limit = yaml.safe_load(config.read_text())["step_limit"]
        assert f"`{config.stem}`" in text, f"docs/environments.md does not list the env {config.stem}"
        assert re.search(rf"\b{config.stem} {limit}\b", text), (
            f"docs/environments.md does not state {config.stem}'s step_limit {limit}"
        )


def test_an_interface_synopsis_lists_every_component():
    from env_pool.interface.state import COMPONENTS

    synopses = [m for page in PAGES for m in re.findall(r"\[--interface ([a-z_,]+)\]", page.read_text())]
    assert synopses
    for listed in synopses:
        assert sorted(listed.split(",")) == sorted(COMPONENTS), listed


@cache
def installed(module: str) -> bool:
    """Whether ``module`` imports outside the checkout (from /, no PYTHONPATH): SEAL's own packages do."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([sys.executable, "-c", code], cwd="/", env={}, timeout=60).returncode == 0


def outside_envs() -> dict[str, str]:
    """configs/env options whose module lives in the checkout but is not an installed package."""
    out = {}
    for config in ENV_CONFIGS:
        top = yaml.safe_load(config.read_text())["_target_"].split(".")[0]
        if not installed(top):
            out[config.stem] = top
    return out


def test_the_walk_finds_the_example_env_outside_the_packages():
    assert outside_envs() == {"thermostat": "examples"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_command_with_an_env_outside_the_packages_sets_the_path(page):
    names = "|".join(outside_envs())
    bad = [
        line.strip()
        for line in page.read_text().splitlines()
        for cmd in re.findall(rf"[^`]*seal [a-z-]+ [^`]*\benv=(?:{names})\b[^`]*", line)
        if "PYTHONPATH=" not in cmd and "python_path=" not in cmd
    ]
    assert not bad, f"{page.name}: these need PYTHONPATH=$PWD (or python_path=): {bad}"


def test_the_pages_say_test_sh_runs_check_sh_first_and_how_to_fix():
    assert "bash scripts/check.sh" in (ROOT / "scripts" / "test.sh").read_text()
    assert "--fix" in (ROOT / "scripts" / "check.sh").read_text()
    for page in (ROOT / "README.md", ROOT / "docs" / "testing.md"):
        text = flat(page)
        assert "scripts/check.sh" in text and "bash scripts/check.sh --fix" in text, page.name
