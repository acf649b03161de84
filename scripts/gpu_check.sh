#!/usr/bin/env bash
# Every CUDA check one GPU can run, as one table (seal/commands/gpu_check.py): the learner in bf16 on the tiny
# and embedded models (DeepSpeed ZeRO-3 when installed, plain torch otherwise), the KL reference's
# precision under autocast, peak memory against `seal plan`, and `pytest -m gpu`. Needs CUDA torch;
# vLLM, Ray and DeepSpeed only where installed. Without CUDA every row is skipped and it exits 0.
# Arguments go to the module: --json, --models tiny, --no-pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="$root/.venv/bin/python"
[[ -x "$py" ]] || py="$(command -v python3)"
exec "$py" -m seal.commands.gpu_check "$@"
