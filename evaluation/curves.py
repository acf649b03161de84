"""Learning curves over frozen snapshots: each arm's held-in success at every
snapshot step, pooled over seeds, and two arms' paired difference step by step.
Pure functions, no I/O (seal/commands/ablate_curves.py reads the runs and draws).

A point pools every (seed, task) pair of the arm's runs that have a snapshot at that
step, so its rate is successes / pairs with Wilson's interval over the pairs (the
same test tasks in every seed: the interval is about the task sample and the
seeds together, not about seeds alone; the per-seed rates are kept beside it).
The difference between two arms at a step is paired over the (seed, task) pairs
both played there (Agresti and Min's interval, as for before/after).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evaluation.before_after import Change, Rate, paired_change

# task id -> (category, success): one snapshot's results on the test tasks
Results = Mapping[str, tuple[str, bool]]


@dataclass(frozen=True)
class CurvePoint:
    step: int
    pooled: Rate  # over every (seed, task) pair played at this step
    by_seed: Mapping[int, Rate]


@dataclass(frozen=True)
class DifferencePoint:
    step: int
    seeds: tuple[int, ...]
    change: Change  # > 0: the second arm solved more (seed, task) pairs than the first


def held_in(results: Results, held_out: Sequence[str]) -> dict[str, bool]:
    """The held-in tasks of one snapshot: task id -> success."""
    return {t: ok for t, (category, ok) in results.items() if category not in held_out}


def in_category(results: Results, category: str) -> dict[str, bool]:
    return {t: ok for t, (c, ok) in results.items() if c == category}


def arm_curve(runs: Mapping[int, Mapping[int, Mapping[str, bool]]]) -> list[CurvePoint]:
    """``runs``: seed -> snapshot step -> task id -> success (already one view: held-in,
    or one category). One point per step any seed has, pooled over the seeds there."""
    steps = sorted({step for by_step in runs.values() for step in by_step})
    points = []
    for step in steps:
        by_seed = {
            seed: Rate(sum(by_step[step].values()), len(by_step[step]))
            for seed, by_step in sorted(runs.items())
            if step in by_step and by_step[step]
        }
        if not by_seed:
            continue
        pooled = Rate(sum(r.successes for r in by_seed.values()), sum(r.n for r in by_seed.values()))
        points.append(CurvePoint(step, pooled, by_seed))
    return points


def difference_curve(
    first: Mapping[int, Mapping[int, Mapping[str, bool]]], second: Mapping[int, Mapping[int, Mapping[str, bool]]]
) -> list[DifferencePoint]:
    """At every step where both arms have snapshots of the same seeds: second - first,
    paired over (seed, task). A seed whose two runs played different tasks is an error."""
    points = []
    steps = sorted(
        {s for by_step in first.values() for s in by_step} & {s for by_step in second.values() for s in by_step}
    )
    for step in steps:
        seeds = tuple(sorted(s for s in set(first) & set(second) if step in first[s] and step in second[s]))
        if not seeds:
            continue
        a = {f"{s}:{t}": ok for s in seeds for t, ok in first[s][step].items()}
        b = {f"{s}:{t}": ok for s in seeds for t, ok in second[s][step].items()}
        points.append(DifferencePoint(step, seeds, paired_change(a, b)))
    return points


def rate_record(r: Rate) -> dict:
    lo, hi = r.interval
    return {"successes": r.successes, "n": r.n, "rate": r.rate, "ci95": [lo, hi]}


def curve_record(points: Sequence[CurvePoint]) -> list[dict]:
    return [
        {"step": p.step, **rate_record(p.pooled), "by_seed": {str(s): rate_record(r) for s, r in p.by_seed.items()}}
        for p in points
    ]


def difference_record(points: Sequence[DifferencePoint]) -> list[dict]:
    return [
        {
            "step": p.step,
            "seeds": list(p.seeds),
            "pairs": p.change.n,
            "second_only": p.change.gained,
            "first_only": p.change.lost,
            "difference": p.change.change,
            "ci95": list(p.change.interval),
        }
        for p in points
    ]
