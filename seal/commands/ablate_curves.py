"""`seal ablate`'s learning curves: every arm's held-in success at each frozen snapshot
(the closing evaluation of each run plays every snapshot on the same test tasks when
``evaluation.final_snapshots: all``; ``trainer.snapshot_every`` sets how many there are),
pooled over seeds with 95% intervals (evaluation/curves.py), each arm against the first
step by step, the per-category curves, and what the interface evolution did in each run
(guidelines turned on, the tag weights' path). Writes DIR/curves.json, DIR/curves.md and
DIR/curves.png.

Reads only each run's evaluation/final.json, final_tasks.jsonl and metrics.jsonl.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evaluation.before_after import HELD_IN_ALL
from evaluation.curves import arm_curve, curve_record, difference_curve, difference_record, held_in, in_category
from evaluation.frozen import read_final, read_final_tasks
from seal.run.summary import guidelines_turned_on

# arm -> seed -> snapshot step -> task id -> success
ArmRuns = dict[int, dict[int, dict[str, bool]]]


def snapshot_results(run_dir: Path) -> tuple[dict[int, dict[str, tuple[str, bool]]], list[str]]:
    """step -> task id -> (category, success) for every snapshot the closing evaluation played,
    and the held-out categories."""
    final = read_final(run_dir)
    if final is None:
        raise FileNotFoundError(
            f"{run_dir} has no closing evaluation (evaluation/final.json): was evaluation.final=false?"
        )
    steps = final["settings"]["steps"]
    by_name = read_final_tasks(run_dir)
    return {int(step): by_name[name] for name, step in steps.items() if by_name.get(name)}, list(final["held_out"])


def interface_path(run_dir: Path, top: int = 3) -> dict[str, Any]:
    """Which guidelines turned on at which step, and the tags whose weights moved most (first -> last
    step) with each one's path (its weight at every step that logged tag weights)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    logged = [(r.get("step"), r["tag_weights"]) for r in rows if r.get("tag_weights")]
    moved: list[dict[str, Any]] = []
    if logged:
        first, last = logged[0][1], logged[-1][1]
        tags = sorted(set(first) | set(last), key=lambda t: -abs(last.get(t, 1.0) - first.get(t, 1.0)))
        moved = [
            {
                "tag": t,
                "first": first.get(t),
                "last": last.get(t),
                "path": [{"step": step, "weight": w.get(t)} for step, w in logged],
            }
            for t in tags[:top]
        ]
    return {
        "guidelines": [{"guideline": g, "step": s} for g, s in guidelines_turned_on(rows)],
        "interface_version": rows[-1].get("interface_version") if rows else None,
        "tag_weights": moved,
    }


def curve_table(runs: Mapping[str, Mapping[int | None, Path]]) -> dict[str, Any]:
    """``runs``: arm -> seed -> run dir (a run without --seeds is seed None, shown as 0)."""
    held_out: list[str] = []
    views: dict[str, dict[str, ArmRuns]] = {}  # view (held-in or a category) -> arm -> seed -> step -> tasks
    interface = []
    for arm, by_seed in runs.items():
        for seed, run_dir in by_seed.items():
            results, held_out = snapshot_results(Path(run_dir))
            s = 0 if seed is None else int(seed)
            for step, tasks in results.items():
                categories = sorted({c for c, _ in tasks.values()})
                views.setdefault(HELD_IN_ALL, {}).setdefault(arm, {}).setdefault(s, {})[step] = held_in(tasks, held_out)
                for c in categories:
                    views.setdefault(c, {}).setdefault(arm, {}).setdefault(s, {})[step] = in_category(tasks, c)
            interface.append({"arm": arm, "seed": seed, **interface_path(Path(run_dir))})
    arms = list(runs)
    curves = {
        view: {arm: curve_record(arm_curve(by_arm[arm])) for arm in arms if arm in by_arm}
        for view, by_arm in views.items()
    }
    held = views.get(HELD_IN_ALL, {})
    differences = {
        arm: difference_record(difference_curve(held[arms[0]], held[arm]))
        for arm in arms[1:]
        if arm in held and arms[0] in held
    }
    return {"arms": arms, "held_out": held_out, "curves": curves, "differences": differences, "interface": interface}


def _pct(point: Mapping[str, Any]) -> str:
    lo, hi = point["ci95"]
    return f"{100 * point['rate']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] ({point['successes']}/{point['n']})"


def curves_markdown(table: Mapping[str, Any]) -> str:
    arms = table["arms"]
    held = table["curves"].get(HELD_IN_ALL, {})
    steps = sorted({p["step"] for arm in arms for p in held.get(arm, [])})
    at = {arm: {p["step"]: p for p in held.get(arm, [])} for arm in arms}
    lines = [
        "## Held-in success over training (frozen snapshots, test split, raw interface, greedy)",
        "",
        "Each cell pools the arm's seeds: successes of (seed, task) pairs with a 95% Wilson interval.",
        "",
        "| step | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    lines += [f"| {s} | " + " | ".join(_pct(at[a][s]) if s in at[a] else "n/a" for a in arms) + " |" for s in steps]
    for arm, points in table["differences"].items():
        lines += ["", f"{arm} - {arms[0]}, held-in, paired over (seed, task) at each step:", ""]
        for d in points:
            lo, hi = d["ci95"]
            lines.append(
                f"- step {d['step']}: {100 * d['difference']:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] "
                f"({d['pairs']} pairs; {d['second_only']} solved by {arm} only, {d['first_only']} by {arms[0]} only)"
            )
    last = {view: {arm: pts[-1] for arm, pts in by_arm.items() if pts} for view, by_arm in table["curves"].items()}
    lines += [
        "",
        "Final snapshot per category:",
        "",
        "| category | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for view in sorted(last, key=lambda v: (v == HELD_IN_ALL, v in table["held_out"], v)):
        name = f"{view} (held out)" if view in table["held_out"] else view
        lines.append(
            f"| {name} | " + " | ".join(_pct(last[view][a]) if a in last[view] else "n/a" for a in arms) + " |"
        )
    lines += [
        "",
        "What the interface evolution did (guidelines turned on; the three tag weights that moved most, "
        "each at the first logged step and at every snapshot step):",
        "",
    ]
    for run in table["interface"]:
        g = ", ".join(f"{x['guideline']} (step {x['step']})" for x in run["guidelines"]) or "none"
        w = "; ".join(f"{x['tag']} {_weight_path(x, steps)}" for x in run["tag_weights"]) or "n/a"
        if run["tag_weights"] and all(_unchanged(x) for x in run["tag_weights"]):
            w = "unchanged (none moved from its first logged value)"
        seed = "-" if run["seed"] is None else run["seed"]
        lines.append(
            f"- {run['arm']} seed {seed}: interface v{run['interface_version']}; guidelines {g}; tag weights {w}"
        )
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _unchanged(moved: Mapping[str, Any]) -> bool:
    values = [p["weight"] for p in moved.get("path") or []] or [moved["first"], moved["last"]]
    return len(set(values)) == 1


def _weight_path(moved: Mapping[str, Any], steps: list[int]) -> str:
    """``1.50 (step 1) -> 1.70 (5) -> 1.83 (10)``: the first logged step, then the snapshot steps."""
    path = moved.get("path") or []
    if not path:
        return f"{_num(moved['first'])} -> {_num(moved['last'])}"
    shown = [p for i, p in enumerate(path) if i == 0 or p["step"] in steps or i == len(path) - 1]
    head, *rest = shown
    return " -> ".join(
        [f"{_num(head['weight'])} (step {head['step']})", *(f"{_num(p['weight'])} ({p['step']})" for p in rest)]
    )


def plot_curves(table: Mapping[str, Any], path: Path) -> Path:
    """Success vs step, one line per arm with its shaded 95% interval: the held-in pool, then each category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    views = sorted(table["curves"], key=lambda v: (v != HELD_IN_ALL, v in table["held_out"], v))
    fig, axes = plt.subplots(1, len(views), figsize=(4.2 * len(views), 3.6), squeeze=False, sharey=True)
    for ax, view in zip(axes[0], views, strict=True):
        for arm in table["arms"]:
            points = table["curves"][view].get(arm, [])
            if not points:
                continue
            steps = [p["step"] for p in points]
            line = ax.plot(steps, [100 * p["rate"] for p in points], marker="o", label=arm)[0]
            lo, hi = zip(*(p["ci95"] for p in points), strict=True)
            ax.fill_between(steps, [100 * x for x in lo], [100 * x for x in hi], color=line.get_color(), alpha=0.2)
        ax.set_title(f"{view} (held out)" if view in table["held_out"] else view)
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test success, % (95% interval)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_curves(runs: Mapping[str, Mapping[int | None, Path]], out: Path) -> tuple[dict[str, Any], str]:
    table = curve_table(runs)
    text = curves_markdown(table)
    (out / "curves.json").write_text(json.dumps(table, indent=1))
    (out / "curves.md").write_text(text)
    plot_curves(table, out / "curves.png")
    return table, text
