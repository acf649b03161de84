"""`seal bench`: every part runs on a tiny configuration and writes well-formed JSON.

Not timed tests: the figures themselves are not checked against targets (the
machine is shared and noisy), only that each part measures something, reports
it in the documented shape (the keys the issue names), writes the JSON and
the plot, and keeps stdout to one JSON object with --json. Each runs as a user
would, `seal bench PART --json --repeats 1 ...`, from outside the checkout.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One env actor: a pipeline start pays for each, and one group per step needs no more.
TINY = ["model=tiny", "learner=torch", "sampling.max_new_tokens=16", "cluster.env_actors=1"]
LOAD_KEYS = {"loadavg_before", "loadavg_after", "other_processes_cpu_share", "ours_cpu_share", "cpus"}


# A cluster someone else points this shell at (CI once had one running): a
# benchmark starts its own Ray instance and must never try to join it.
FOREIGN_CLUSTER = {"RAY_ADDRESS": "127.0.0.1:9"}


def bench(tmp_path: Path, part: str, *args: str, timeout: int = 900) -> dict:
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "seal.commands.cli",
            "bench",
            part,
            "--json",
            "--repeats",
            "1",
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, **FOREIGN_CLUSTER},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"stdout must hold exactly one JSON object, got: {proc.stdout[:2000]}"
    report = json.loads(lines[0])
    stem = f"bench_{part.replace('-', '_')}"
    written = json.loads((out / f"{stem}.json").read_text())
    assert written["part"] == report["part"] == part
    assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert LOAD_KEYS <= set(report["outside_load"]) and report["machine"]["cpus"] >= 1
    assert report["command"].startswith(f"seal bench {part}")
    return report


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_transport_compares_zmq_with_queues_per_size(tmp_path):
    r = bench(tmp_path, "transport", "--tokens", "2048,8192", "--mb", "2")
    assert r["sizes_tokens"] == [2048, 8192] and r["frame_bytes"][1] > r["frame_bytes"][0] > 2048 * 9
    for path in ("zmq", "mp_queue", "queue"):
        assert len(r[path]["msgs_per_s"]) == 2 and all(map(positive, r[path]["msgs_per_s"] + r[path]["mb_per_s"]))
    assert all(positive(x["median"]) for x in r["zmq_over_mp_queue"])
    assert all(positive(c["encode"]) and positive(c["decode"]) for c in r["per_message_ms"])


def test_env_scaling_reports_rates_per_actor_count(tmp_path):
    r = bench(tmp_path, "env", "--actors", "1,2", "--episodes", "20")
    assert r["actors"] == [1, 2] and r["distinct_processes"] == 2
    assert len(r["episodes_per_s"]) == len(r["tool_calls_per_s"]) == 2
    assert all(map(positive, r["episodes_per_s"] + r["tool_calls_per_s"]))
    assert r["parallel_efficiency"][0] == pytest.approx(1.0)


def test_precision_puts_fp32_and_bf16_side_by_side(tmp_path):
    r = bench(
        tmp_path,
        "precision",
        "--model",
        "tiny",
        "--sequences",
        "2",
        "--prompt-tokens",
        "32",
        "--new-tokens",
        "4",
        "--shapes",
        "toy",
    )
    assert set(r["per_dtype"]) == {"float32", "bfloat16"}
    for dtype, per in r["per_dtype"].items():
        assert per["generator_dtype"] == per["learner_dtype"] == dtype
        assert positive(per["generator_tokens_per_s"]["median"]) and positive(per["learner_tokens_per_s"]["median"])
        assert per["steps"]["toy"]["mismatch_abs_logprob_diff"]["median"] < 0.1  # vLLM and learner at the same weights
    assert all(positive(r[k]) for k in ("generator_speedup", "learner_speedup")) and positive(r["step_speedup"]["toy"])
    assert r["dtype_auto"] in ("float32", "bfloat16") and "cpu_flags" in r["machine"]


def test_weights_publish_against_memcpy(tmp_path):
    r = bench(tmp_path, "weights", "--models", "tiny", *TINY)
    assert r["models"] == ["tiny"]
    assert all(len(r[k]) == 1 and positive(r[k][0]) for k in ("publish_s", "memcpy_s", "model_bytes"))
    assert 10 * 2**20 < r["model_bytes"][0] < 16 * 2**20  # ~3.2M fp32 parameters, the tied embedding sent once
    assert r["buckets"] == [1]  # 256 MB buckets (the config's default): the tiny model in one
    assert r["breakdown"]["tiny"]["first_token_s"] > 0


@pytest.mark.slow  # two publish measurements, each with its own engine
def test_weights_with_lora_publish_the_adapter_against_the_whole_model(tmp_path):
    r = bench(tmp_path, "weights", "--models", "tiny", "--lora", "8", *TINY)
    assert r["models"] == ["tiny", "tiny+lora8"] and r["lora_rank"] == 8
    full, lora = r["model_bytes"]
    assert lora < full / 20  # the adapter's tensors alone, not the model
    ratios = r["lora_vs_full"]["tiny"]
    assert ratios["publish_bytes_ratio"] == full / lora and positive(ratios["publish_s_ratio"])
    assert {t["name"] for t in r["targets"]} >= {
        "full / LoRA publish bytes (tiny)",
        "full / LoRA publish seconds (tiny)",
    }


@pytest.mark.slow  # about a minute on 2 cores (measured 2026-12-03); scripts/test.sh --all runs it
def test_sync_async_reports_step_times_overlap_and_staleness(tmp_path):
    r = bench(tmp_path, "sync-async", "--steps", "1", *TINY)
    for key in (
        "t_step_sync",
        "t_step_async",
        "t_generate",
        "t_learn",
        "overlap_efficiency",
        "speedup",
        "ideal_speedup",
    ):
        assert positive(r[key]), key
    assert 1.0 <= r["ideal_speedup"] <= 2.0
    assert r["overlap_efficiency"] == pytest.approx(max(r["t_generate"], r["t_learn"]) / r["t_step_async"], rel=1e-6)
    assert r["staleness"]["sync_max"] == 0 and sum(r["staleness"]["async_groups"].values()) >= 1
    assert set(r["idle_ratio"]) == {"sync", "async"}
    assert {t["name"] for t in r["targets"]} >= {"async overlap efficiency", "async speedup / ideal speedup"}


@pytest.mark.slow  # about a minute on 2 cores (measured 2026-12-03); scripts/test.sh --all runs it
def test_rollout_learn_times_each_stage_alone_and_in_the_pipeline(tmp_path):
    # Two measured steps: in async mode a single step can train on a group made during the
    # warm-up and generate nothing itself; the third group cannot start before the first
    # publish (staleness bound 1), so it is generated inside the measured window.
    r = bench(tmp_path, "rollout-learn", "--steps", "2", *TINY)
    for side in ("alone", "pipeline"):
        for key in (
            "gen_tokens_per_s",
            "trajectories_per_s",
            "env_steps_per_s",
            "learner_samples_per_s",
            "learner_tokens_per_s",
        ):
            assert positive(r[side][key]["median"]), (side, key)
    assert positive(r["t_generate_batch"]) and positive(r["t_learn_batch"])
    assert 0 <= r["env_fraction"]["median"] < 1


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None,
    reason="TRL is an extra for this benchmark only: .venv/bin/pip install -r requirements/bench.txt",
)
def test_trl_side_by_side_on_the_same_work(tmp_path):
    r = bench(tmp_path, "trl", "--steps", "1", *TINY, "n=2")
    assert positive(r["ours_samples_per_s"]) and positive(r["trl_samples_per_s"])
    assert r["ratio"] == pytest.approx(r["ours_samples_per_s"] / r["trl_samples_per_s"], rel=1e-6)  # one repeat
    assert r["n"] == 2 and r["trl_version"] and r["notes"]
    assert {r["precision"]["trl"], r["precision"]["ours_learner"]} <= {"float32", "bfloat16"}  # both recorded


def test_bad_part_and_options_are_one_line_errors(tmp_path):
    for args in (["nope"], ["sync-async", "--warmup", "0"], ["env", "--repeats", "0"]):
        proc = subprocess.run(
            [sys.executable, "-m", "seal.commands.cli", "bench", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert proc.returncode == 2 and proc.stderr.startswith("seal: error:"), (args, proc.stderr)


def test_learner_packing_compares_packed_and_unpacked_steps(tmp_path):
    out = tmp_path / "packing.json"
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_packing.py"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--model",
            "tiny",
            "--prompt",
            "64",
            "--continuation",
            "24",
            "--rounds",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert (
        positive(r["unpacked"]["step_s_median"])
        and positive(r["packed"]["step_s_median"])
        and positive(r["speedup_median"])
    )
    assert r["unpacked"]["forward_tokens"] == 2 * (64 + 24) and r["packed"]["forward_tokens"] == 64 + 2 * 24
    assert r["max_relative_loss_gap"] < 1e-4  # the same update, packed or not


@pytest.mark.slow
def test_learner_scale_reports_one_and_two_ranks(tmp_path):
    r = bench(tmp_path, "learner-scale", "--shapes", "toy")
    assert (
        r["world_size"] == [1, 2] and len(r["samples_per_s"]) == len(r["comm_share"]) == len(r["peak_gb_per_rank"]) == 2
    )
    assert all(map(positive, r["samples_per_s"] + r["peak_gb_per_rank"]))
    assert 0 <= r["comm_share"][0] <= r["comm_share"][1] < 1 and len(r["peak_gb_by_rank"]["2"]) == 2


@pytest.mark.slow  # about a minute on 2 cores (measured 2026-12-03); scripts/test.sh --all runs it
def test_generator_compares_blocking_and_continuous_batching(tmp_path):
    r = bench(
        tmp_path,
        "generator",
        "--model",
        "tiny",
        "--concurrency",
        "1,2",
        "--turns",
        "2",
        "--episodes",
        "2",
        "--min-new",
        "4",
        "--max-new",
        "24",
        "--env-ms",
        "0",
    )
    assert r["concurrency"] == [1, 2]
    for key in (
        "blocking_tokens_per_s",
        "continuous_tokens_per_s",
        "speedup",
        "blocking_wait_per_call_s",
        "continuous_wait_per_call_s",
    ):
        assert len(r[key]) == 2 and all(map(positive, r[key])), key
    assert set(r["update_s"]) == {"pause", "keep", "abort"} and all(map(positive, r["update_s"].values()))
    assert set(r["replicas_tokens_per_s"]) == {"1", "2"} and r["update_bytes"] > 0
    assert r["targets"][0]["measured"] is None  # no point at >= 8 episodes in this run


@pytest.mark.slow  # two learner benches: 28 s on 2 cores (CI, 2026-12-06)
def test_learner_reports_phases_flops_and_the_peak_against_a_baseline_checkout(tmp_path):
    """One tiny learner step per system; the baseline is this checkout again (any commit's worktree works)."""
    repo = Path(__file__).resolve().parents[2]
    r = bench(tmp_path, "learner", "--shapes", "main", "--steps", "1", "--baseline", str(repo), "model=tiny")
    assert {"phases", "tokens_per_s", "flops_per_s", "peak_flops_per_s", "peak_fraction"} <= r.keys()
    assert all(map(positive, (r["tokens_per_s"], r["flops_per_s"], r["peak_flops_per_s"])))
    assert r["peak_fraction"] == pytest.approx(r["flops_per_s"] / r["peak_flops_per_s"])
    phases = r["phases"]
    assert {"policy_forward", "logprobs", "reference_forward", "backward", "optimizer", "publish"} <= phases.keys()
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0, abs=1e-6)
    main = r["shapes"]["main"]
    assert main["group"]["n"] == 6 and main["speedup"] > 0 and main["baseline"]["peak_rss_gb"] > 0
