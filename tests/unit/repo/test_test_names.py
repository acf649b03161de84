"""Test modules are imported by basename (no __init__.py under tests/, pytest's default import
mode): two files of one name in different folders stop the whole run at collection, which a run
of one folder does not show."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_every_test_module_has_a_name_of_its_own():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
