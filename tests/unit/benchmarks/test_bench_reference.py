"""`seal bench reference` (benchmarks/bench_reference.py): the per-token gaps and the table; the
engines themselves run in the benchmark."""

from __future__ import annotations

import pytest

from benchmarks.bench_reference import _gap, _quantile, render


def test_gaps_are_absolute_per_token_differences():
    gap = _gap([-1.0, -2.0, -0.5, -3.0], [-1.5, -2.0, -0.25, -2.0])
    assert gap == {"mean": pytest.approx((0.5 + 0 + 0.25 + 1.0) / 4), "p99": 1.0, "max": 1.0}
    with pytest.raises(ValueError):  # a token on one side only is a bug, not a shorter mean
        _gap([-1.0, -2.0], [-1.0])


def test_quantile_picks_from_the_sorted_values():
    values = [float(v) for v in range(100)]
    assert _quantile(values, 0.99) == 99.0 and _quantile(values, 0.5) == 50.0 and _quantile([3.0], 0.99) == 3.0


def test_the_table_sets_the_reference_gap_beside_the_behaviour_gap():
    report = {
        "sequences": 2,
        "sequence_tokens": 1500,
        "completion_tokens": 30,
        "generator_dtype": "bfloat16",
        "learner_dtype": "bfloat16",
        "reference_gap": {"mean": 0.0209, "p99": 0.147, "max": 0.15},
        "behaviour_gap": {"mean": 0.0212, "p99": 0.147, "max": 0.15},
        "generator_reference_s": 3.2,
        "learner_reference_s": 10.1,
        "k3_with_generator_reference_at_step0": 6.2e-4,
    }
    text = render(report)
    assert "generator reference vs learner reference" in text and "behaviour vs learner policy" in text
    assert "0.0209" in text and "0.0212" in text and "6.20e-04" in text
