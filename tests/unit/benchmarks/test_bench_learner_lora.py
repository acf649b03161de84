"""`seal bench learner --lora R` (benchmarks/bench_learner.py): LoRA against full training on the same
shapes, its ratios and its table; the probes themselves run in `seal bench learner`."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.bench_learner import add_arguments, lora_ratios, render


def system(step_s: float, rss: float, publish_mb: float, publish_s: float) -> dict:
    one = lambda v: {"median": v}  # summary()'s shape
    return {
        "step_s": one(step_s),
        "tokens_per_s": one(1000 / step_s),
        "flops_per_s": 1e11,
        "peak_flops_per_s": 4e11,
        "peak_fraction": 0.25,
        "peak_rss_gb": rss,
        "publish_bytes": publish_mb * 1e6,
        "publish_s": one(publish_s),
    }


def test_ratios_say_how_much_faster_and_smaller_lora_is():
    full, lora = system(12.0, 6.0, 270.0, 1.5), system(8.0, 3.0, 5.0, 0.05)
    r = lora_ratios(full, lora)
    assert r == pytest.approx(
        {"step_speedup": 1.5, "rss_ratio": 0.5, "publish_bytes_ratio": 54.0, "publish_s_ratio": 30.0}
    )
    report = {
        "shapes": {
            "main": {
                "full": full,
                "lora": lora,
                "group": {"n": 6, "prompt_tokens": 705, "sequence_tokens": 5145},
                "lora_vs_full": r,
            }
        }
    }
    text = render(report)
    assert "lora" in text and "full" in text and "publish MB" in text
    assert "LoRA vs full: step 1.50x faster, peak RSS x0.50, publish 54.0x fewer bytes, 30.0x shorter" in text


def test_lora_and_a_baseline_are_not_measured_together(tmp_path):
    from benchmarks.bench_learner import run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "engine.py").write_text("")
    args = parser.parse_args(["--lora", "8", "--baseline", str(tmp_path), "--shapes", "main"])
    args.repeats, args.overrides = 1, []
    with pytest.raises(ValueError, match="leave out --baseline"):
        run(args)
