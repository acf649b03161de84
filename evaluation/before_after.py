"""Before and after: success per category of two frozen snapshots on the same tasks,
with counts, 95% intervals and the paired change. Pure functions, no I/O.

- A rate's interval is Wilson's score interval: unlike the normal one it stays
  inside [0, 1] and has width at 0 of n or n of n, where a small model's
  categories often start.
- The change is paired: both snapshots ran the same tasks, so the change is
  (tasks only the later one solved - tasks only the earlier one solved) / tasks,
  and its interval is Agresti and Min's (2005) for paired proportions: the Wald
  interval after adding one half to each cell of the 2x2 table, which has width
  even when no task changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Rate:
    successes: int
    n: int

    @property
    def rate(self) -> float:
        return self.successes / self.n

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)


@dataclass(frozen=True)
class Change:
    n: int
    gained: int  # tasks the later snapshot solved and the earlier did not
    lost: int  # tasks the earlier snapshot solved and the later did not

    @property
    def change(self) -> float:
        return (self.gained - self.lost) / self.n

    @property
    def interval(self) -> tuple[float, float]:
        g, l, n = self.gained + 0.5, self.lost + 0.5, self.n + 2
        d = (g - l) / n
        half = Z95 * math.sqrt(max(0.0, (g + l) - (g - l) ** 2 / n)) / n
        return max(-1.0, d - half), min(1.0, d + half)


def paired_change(before: Mapping[str, bool], after: Mapping[str, bool]) -> Change:
    if set(before) != set(after):
        raise ValueError(
            f"the snapshots ran different tasks ({len(set(before) ^ set(after))} differ): no paired change"
        )
    if not before:
        raise ValueError("no tasks to compare")
    gained = sum(1 for t in before if after[t] and not before[t])
    lost = sum(1 for t in before if before[t] and not after[t])
    return Change(len(before), gained, lost)


@dataclass(frozen=True)
class Row:
    name: str  # a category, or "held-in (all)" pooled over the held-in categories
    held_out: bool
    before: Rate
    after: Rate
    change: Change


HELD_IN_ALL = "held-in (all)"


def before_after_rows(
    before: Mapping[str, tuple[str, bool]], after: Mapping[str, tuple[str, bool]], held_out: Sequence[str]
) -> list[Row]:
    """One row per category (held-in ones first, sorted), then the held-in pool when it
    spans more than one category. ``before``/``after``: task id -> (category, success)."""
    if set(before) != set(after):
        raise ValueError(f"the snapshots ran different tasks ({len(set(before) ^ set(after))} differ)")
    for task, (category, _) in before.items():
        if after[task][0] != category:
            raise ValueError(f"task {task} is {category!r} in one snapshot and {after[task][0]!r} in the other")
    categories = sorted({c for c, _ in before.values()}, key=lambda c: (c in held_out, c))

    def row(name: str, tasks: list[str], out: bool) -> Row:
        b = {t: before[t][1] for t in tasks}
        a = {t: after[t][1] for t in tasks}
        return Row(name, out, Rate(sum(b.values()), len(b)), Rate(sum(a.values()), len(a)), paired_change(b, a))

    rows = [row(c, [t for t, (cat, _) in before.items() if cat == c], c in held_out) for c in categories]
    held_in = [c for c in categories if c not in held_out]
    if len(held_in) > 1:
        rows.append(row(HELD_IN_ALL, [t for t, (cat, _) in before.items() if cat in held_in], False))
    return rows


def row_record(r: Row) -> dict:
    return {
        "name": r.name,
        "held_out": r.held_out,
        "before": {
            "successes": r.before.successes,
            "n": r.before.n,
            "rate": r.before.rate,
            "ci95": list(r.before.interval),
        },
        "after": {"successes": r.after.successes, "n": r.after.n, "rate": r.after.rate, "ci95": list(r.after.interval)},
        "change": {
            "value": r.change.change,
            "gained": r.change.gained,
            "lost": r.change.lost,
            "ci95": list(r.change.interval),
        },
    }


def held_in_record(records: Sequence[Mapping]) -> Mapping | None:
    """Among row_record()s (final.json's rows): the held-in pool's, else the one held-in category's."""
    held_in = [r for r in records if not r["held_out"]]
    return next((r for r in held_in if r["name"] == HELD_IN_ALL), held_in[0] if held_in else None)
