#!/usr/bin/env bash
# Runs the format, lint and type checks (scripts/check.sh), then the test suite, setting up
# first if needed. `--all` includes slow tests;
# other arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
marker=(-m "not slow")
if [[ "${1:-}" == "--all" ]]; then
  marker=()
  shift
fi
bash scripts/check.sh
exec .venv/bin/python -m pytest "${marker[@]}" "$@"
