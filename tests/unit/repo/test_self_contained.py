"""No file of the repository cites a document outside it: the design background a reader needs is
docs/design.md, and a citation of the outside design notes (by their file name) sends a reader to a
file they cannot open. Pure file reading over what git tracks or would track."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Spelled in two pieces so this file does not match itself.
OUTSIDE_NOTES = "DESIGN" + ".md"


def repository_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def citing(root: Path, names: list[str]) -> list[str]:
    out = []
    for name in names:
        text = (root / name).read_bytes().decode("utf-8", errors="ignore")
        out += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE_NOTES in line]
    return out


def test_no_file_cites_the_outside_design_notes():
    found = citing(ROOT, repository_files())
    assert not found, "cite docs/design.md (or another page here) instead of the outside notes:\n" + "\n".join(found)


def test_the_check_finds_a_citation(tmp_path):
    (tmp_path / "a.py").write_text(f'"""See {OUTSIDE_NOTES} section 3."""\n')
    (tmp_path / "b.md").write_text("See [design](docs/design.md).\n")
    assert citing(tmp_path, ["a.py", "b.md"]) == ["a.py:1"]
