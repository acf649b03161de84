"""docs/custom-environment.md walks through examples/minimal/ as it is: the code it shows is the
file's own, and the line counts it states are the files'. (The integration test runs its commands.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = (ROOT / "docs" / "custom-environment.md").read_text()
EXAMPLE = ROOT / "examples" / "minimal"


def test_the_code_the_page_shows_is_the_examples_own():
    blocks = re.findall(r"```python\n(.*?)```", PAGE, re.S)
    shown = [b for b in blocks if "class UnitsEnv" in b]
    assert shown and shown[0] in (EXAMPLE / "units.py").read_text()


def test_the_line_counts_the_page_states_are_the_files():
    counts = {name: len((EXAMPLE / name).read_text().splitlines()) for name in ("units.py", "units.yaml")}
    assert f"units.py): {counts['units.py']} lines" in PAGE
    assert f"a {counts['units.yaml']}-line\n[units.yaml]" in PAGE
