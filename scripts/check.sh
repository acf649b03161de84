#!/usr/bin/env bash
# Format, lint and type checks (settings: pyproject.toml). scripts/test.sh runs this before the
# tests, so CI (.ci/run) does too; .pre-commit-config.yaml runs the same tools on each commit.
#   bash scripts/check.sh          check only
#   bash scripts/check.sh --fix    apply ruff's safe fixes and the formatter first
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin="$root/.venv/bin"
if [[ "${1:-}" == "--fix" ]]; then
  "$bin/ruff" check --fix --quiet .
  "$bin/ruff" format --quiet .
fi
"$bin/ruff" check .
"$bin/ruff" format --check --quiet . || { echo "check: run 'bash scripts/check.sh --fix' to format" >&2; exit 1; }
"$bin/mypy"
echo "check: ruff, ruff format and mypy passed"
