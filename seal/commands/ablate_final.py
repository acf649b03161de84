"""`seal ablate`'s table of the closing frozen evaluations (evaluation/frozen.py): every
arm and seed, A_0 -> final snapshot on the same test tasks (raw interface, greedy), and
each arm's final snapshot against the first arm's, paired over (seed, task).

Reads only RUN_DIR/evaluation/final.json and final_tasks.jsonl of each run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluation.before_after import held_in_record, paired_change
from evaluation.frozen import read_final, read_final_tasks


def final_table(runs: dict[str, dict[int | None, Path]]) -> dict[str, Any]:
    """``runs``: arm -> seed -> run dir. Per run: held-in and held-out rates before/after with
    intervals; per arm after the first: its final held-in success against the first arm's."""
    per_run, results = [], {}
    for arm, by_seed in runs.items():
        for seed, run_dir in by_seed.items():
            final = read_final(run_dir)
            if final is None:
                raise FileNotFoundError(
                    f"{run_dir} has no closing evaluation (evaluation/final.json): was evaluation.final=false?"
                )
            held_in = held_in_record(final["rows"])
            held_out = [r for r in final["rows"] if r["held_out"]]
            per_run.append(
                {"arm": arm, "seed": seed, "run_dir": str(run_dir), "held_in": held_in, "held_out": held_out}
            )
            out_cats = {r["name"] for r in held_out}
            results[(arm, seed)] = {
                t: ok
                for t, (cat, ok) in read_final_tasks(run_dir).get(final["after"], {}).items()
                if cat not in out_cats
            }
    arms = list(runs)
    comparisons = []
    for arm in arms[1:]:
        seeds = sorted(set(runs[arm]) & set(runs[arms[0]]), key=lambda s: -1 if s is None else s)
        first = {f"{s}:{t}": ok for s in seeds for t, ok in results[(arms[0], s)].items()}
        other = {f"{s}:{t}": ok for s in seeds for t, ok in results[(arm, s)].items()}
        c = paired_change(other, first)  # > 0: the first arm solved more
        comparisons.append(
            {
                "arms": [arms[0], arm],
                "seeds": seeds,
                "pairs": c.n,
                "first_only": c.gained,
                "other_only": c.lost,
                "difference": c.change,
                "ci95": list(c.interval),
            }
        )
    return {"runs": per_run, "comparisons": comparisons}


def _rate(side: dict[str, Any]) -> str:
    lo, hi = side["ci95"]
    return f"{side['successes']}/{side['n']} = {100 * side['rate']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]"


def final_markdown(table: dict[str, Any]) -> str:
    lines = [
        "## Closing frozen evaluation (test split, raw interface, greedy; 95% intervals)",
        "",
        "| arm | seed | held-in A_0 | held-in final | change (pts) | held-out final |",
        "|---|---|---|---|---|---|",
    ]
    for r in table["runs"]:
        c = r["held_in"]["change"]
        held_out = "; ".join(f"{h['name']} {_rate(h['after'])}" for h in r["held_out"]) or "n/a"
        lines.append(
            f"| {r['arm']} | {r['seed'] if r['seed'] is not None else '-'} | {_rate(r['held_in']['before'])} | "
            f"{_rate(r['held_in']['after'])} | {100 * c['value']:+.0f} [{100 * c['ci95'][0]:+.0f}, {100 * c['ci95'][1]:+.0f}] | "
            f"{held_out} |"
        )
    for c in table["comparisons"]:
        a, b = c["arms"]
        lo, hi = c["ci95"]
        lines += [
            "",
            f"{a} vs {b}, final held-in success paired over {c['pairs']} (seed, task) pairs: "
            f"{100 * c['difference']:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] "
            f"({c['first_only']} solved by {a} only, {c['other_only']} by {b} only)",
        ]
    return "\n".join(lines) + "\n"


def seed_dirs(out: Path, name: str, seeds: Sequence[int] | None) -> dict[int | None, Path]:
    return {None: out / name} if not seeds else {s: out / name / f"seed{s}" for s in seeds}
