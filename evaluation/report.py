"""Markdown report with plots for one run's evaluation (docs/design.md, evaluation).

``write_report`` takes the dict from ``evaluation.metrics.summarize``, the
per-task results it came from, and the run's training rounds (metrics.jsonl
rows), and writes report.md, summary.json, results.csv and PNG plots into one
folder. matplotlib is imported inside the plotting functions so importing this
package stays light; plots are drawn on bare ``Figure`` objects (Agg canvas),
never through pyplot, so no global backend is switched in the caller's process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluation.records import TaskResult, write_task_csv

Round = Mapping[str, Any]  # step, tag_fractions, tag_weights, interface_version, active_guidelines, reward_mean
ROLE_ORDER = ("validation", "id", "ood", "replay")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _pp(x: float | None) -> str:  # a difference of rates, in percentage points
    return "n/a" if x is None else f"{100 * x:+.1f} pp"


def _num(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    return f"{x:,}" if isinstance(x, int) else f"{x:,.{digits}f}"


def _views(summary: Mapping[str, Any]) -> list[str]:
    """Views in role order (validation, id, ood, replay), then any others."""
    present = sorted({v for per in summary["success"].values() for v in per})
    roles = [summary["views"][r] for r in ROLE_ORDER if summary["views"][r] in present]
    return roles + [v for v in present if v not in roles]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _snapshot_axis(ax, names: Sequence[str]) -> None:
    # Rotate labels when many snapshots would make them collide.
    ax.set_xticks(
        range(len(names)), names, rotation=45 if len(names) > 8 else 0, ha="right" if len(names) > 8 else "center"
    )
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.grid(axis="y", alpha=0.3)


def plot_validation(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Update-validation success per category and macro over snapshots."""
    from matplotlib.figure import Figure

    names, view = summary["snapshots"], summary["views"]["validation"]
    entries = [summary["success"][n].get(view) for n in names]
    if not any(entries):
        return None
    categories = sorted({c for e in entries if e for c in e["by_category"]})
    fig = Figure(figsize=(8, 4.2))
    ax = fig.subplots()
    for cat in categories:
        ys = [100 * e["by_category"][cat] if e and cat in e["by_category"] else float("nan") for e in entries]
        ax.plot(range(len(names)), ys, marker="o", label=cat)
    macro = [100 * e["overall"] if e else float("nan") for e in entries]
    ax.plot(range(len(names)), macro, color="black", linewidth=2.5, linestyle="--", marker="s", label="macro")
    best = summary["best_validation"]
    if best is not None:
        ax.axvline(
            names.index(best), color="tab:green", alpha=0.25, linewidth=8, zorder=0, label=f"best validation ({best})"
        )
    _snapshot_axis(ax, names)
    ax.set_ylim(-3, 103)
    ax.set(ylabel="success (%)", title=f"Update-validation success per category (view '{view}')")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    return _save(fig, path)


def plot_replay(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Replay macro success (top) and per-task churn bars DeltaFix / DeltaForget (bottom)."""
    from matplotlib.figure import Figure

    names, view = summary["snapshots"], summary["views"]["replay"]
    if not any(summary["success"][n].get(view) for n in names):
        return None
    fig = Figure(figsize=(8, 5.5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    ys = [
        100 * summary["success"][n][view]["overall"] if view in summary["success"][n] else float("nan") for n in names
    ]
    top.plot(range(len(names)), ys, marker="o", color="tab:blue", label="replay success (macro)")
    for i, n in enumerate(names[1:], start=1):
        drop = summary["forgetting"].get(n)
        if drop:
            top.annotate(
                f"forgetting {_pct(drop)}",
                (i, ys[i]),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                fontsize=8,
                color="tab:red",
            )
    top.set(ylabel="success (%)", title=f"Replay view '{view}'")
    top.set_ylim(-3, 103)
    top.legend(fontsize=8, loc="upper left")
    _snapshot_axis(top, names)
    width = 0.38
    for offset, key, color, label in (
        (-width / 2, "delta_fix", "tab:green", "DeltaFix"),
        (width / 2, "delta_forget", "tab:red", "DeltaForget"),
    ):
        xs = [i + offset for i, n in enumerate(names) if i > 0]
        vals = [100 * (summary[key].get(n, {}).get(view) or 0.0) for i, n in enumerate(names) if i > 0]
        bars = bottom.bar(xs, vals, width=width, color=color, label=label)
        bottom.bar_label(bars, fmt="%.0f", fontsize=7)
    bottom.set(ylabel="% of shared tasks", title="Churn vs previous snapshot")
    bottom.set_ylim(0, max(10.0, bottom.get_ylim()[1] * 1.15))
    bottom.legend(fontsize=8, loc="upper left")
    _snapshot_axis(bottom, names)
    return _save(fig, path)


def _tag_colors(tags: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(tags) <= 10 else "tab20"]
    return {t: cmap(i % cmap.N) for i, t in enumerate(tags)}


def plot_tags(rounds: Sequence[Round], path: Path) -> Path | None:
    """Tag distribution per round (stacked bars) and A-Patch tag weights (lines)."""
    from matplotlib.figure import Figure

    if not rounds:
        return None
    steps = [r["step"] for r in rounds]
    tags = sorted({t for r in rounds for t in (*r.get("tag_fractions", {}), *r.get("tag_weights", {}))})
    colors = _tag_colors(tags)
    fig = Figure(figsize=(9, 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    xs = range(len(rounds))
    shown = [t for t in tags if any(r.get("tag_fractions", {}).get(t, 0.0) for r in rounds)]
    shares = [[100 * r.get("tag_fractions", {}).get(t, 0.0) for r in rounds] for t in shown]
    many = len(rounds) > 40  # discrete bars and markers turn into noise on long runs
    if many:
        top.stackplot(xs, shares, colors=[colors[t] for t in shown], labels=shown, linewidth=0)
    else:
        base = [0.0] * len(rounds)
        for tag, vals in zip(shown, shares):
            top.bar(xs, vals, bottom=base, color=colors[tag], label=tag, width=0.8)
            base = [b + v for b, v in zip(base, vals)]
    top.set(ylabel="share of turns (%)", title="Tag distribution per round")
    for tag in tags:
        ws = [r.get("tag_weights", {}).get(tag, float("nan")) for r in rounds]
        if any(w == w for w in ws):  # skip tags never weighted (all NaN)
            bottom.plot(
                xs, ws, marker=None if many else ".", linewidth=1 if many else 1.5, color=colors[tag], label=tag
            )
    bottom.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    bottom.set(ylabel="weight", xlabel="learner step", title="A-Patch tag weights")
    bottom.set_ylim(0.4, 2.1)  # weights are clipped to [0.5, 2.0]
    # One legend for both panels: a tag keeps its colour in both.
    handles = {lab: h for ax in (top, bottom) for h, lab in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=8)
    _round_axis(bottom, steps)
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    fig.savefig(path, dpi=110)
    return path


def _round_axis(ax, steps: Sequence[int]) -> None:
    # Label at most ~12 rounds so long runs stay readable.
    every = max(1, len(steps) // 12)
    ticks = list(range(0, len(steps), every))
    ax.set_xticks(ticks, [str(steps[i]) for i in ticks])
    ax.set_xlim(-0.6, len(steps) - 0.4)


def plot_interface(rounds: Sequence[Round], path: Path) -> Path | None:
    """Interface version and training reward (top), which guidelines were active in each round (bottom)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not rounds:
        return None
    steps = [r["step"] for r in rounds]
    kinds = sorted({g for r in rounds for g in r.get("active_guidelines", [])})
    fig = Figure(figsize=(9, 2.4 + 0.45 * max(1, len(kinds))))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, max(1.2, 0.45 * len(kinds))))
    versions = [r.get("interface_version", 0) for r in rounds]
    top.step(range(len(rounds)), versions, where="mid", color="tab:purple")
    top.set_ylim(min(versions) - 0.5, max(versions) + 0.5)  # a constant version would otherwise get a +-0.05 axis
    top.set(title="Training interface timeline (and training reward)")
    top.set_ylabel("interface version", color="tab:purple")
    top.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # versions are whole numbers
    top.grid(alpha=0.3)
    rewards = [r.get("reward_mean") for r in rounds]
    if any(v is not None for v in rewards):  # reward beside the version shows whether a change helped training
        twin = top.twinx()
        twin.plot(
            range(len(rounds)),
            [float("nan") if v is None else v for v in rewards],
            color="tab:green",
            linewidth=1,
            label="reward mean",
        )
        twin.set_ylabel("reward mean", color="tab:green")
        twin.set_ylim(-0.05, 1.05)
    for row, kind in enumerate(kinds):
        spans = [(i - 0.5, 1.0) for i, r in enumerate(rounds) if kind in r.get("active_guidelines", [])]
        bottom.broken_barh(spans, (row - 0.35, 0.7), color="tab:orange")
    if kinds:
        bottom.set_yticks(range(len(kinds)), kinds)
        bottom.set_ylim(-0.6, len(kinds) - 0.4)
    else:
        bottom.set_yticks([])
        bottom.text(0.5, 0.5, "no guideline was active", transform=bottom.transAxes, ha="center", va="center")
    bottom.set(xlabel="learner step", title="Active guidelines")
    bottom.grid(axis="x", alpha=0.3)
    _round_axis(bottom, steps)
    return _save(fig, path)


def plot_cost(summary: Mapping[str, Any], path: Path) -> Path:
    """Per snapshot: rollout tokens per task, tool calls per task, eval wall per task, update tokens per update."""
    from matplotlib.figure import Figure

    names, cost = summary["snapshots"], summary["cost"]
    fig = Figure(figsize=(10, 6))
    axes = fig.subplots(2, 2).ravel()
    xs = range(len(names))
    prompt = [cost[n]["prompt_tokens_per_task"] or 0.0 for n in names]
    gen = [cost[n]["generated_tokens_per_task"] or 0.0 for n in names]
    axes[0].bar(xs, prompt, color="tab:gray", label="prompt")
    axes[0].bar(xs, gen, bottom=prompt, color="tab:blue", label="generated")
    axes[0].set_ylim(0, max(1.0, max(p + g for p, g in zip(prompt, gen)) * 1.3))  # headroom for the legend
    axes[0].legend(fontsize=8, loc="upper left", ncols=2)
    axes[0].set(title="Rollout tokens per task", ylabel="tokens")
    panels = (
        ("tool_calls_per_task", "Tool calls per task", "calls"),
        ("eval_wall_s_per_task", "Eval wall time per task", "seconds"),
        ("update_tokens_per_update", "Update tokens per update", "tokens"),
    )
    for ax, (key, title, unit) in zip(axes[1:], panels):
        vals = [cost[n][key] for n in names]
        bars = ax.bar(xs, [v or 0.0 for v in vals], color="tab:cyan")
        ax.bar_label(bars, labels=["n/a" if v is None else f"{v:,.1f}" for v in vals], fontsize=7)
        ax.set(title=title, ylabel=unit)
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1] * 1.15))
    for ax in axes:
        _snapshot_axis(ax, names)
    return _save(fig, path)


def _changed_tasks(results: Sequence[TaskResult], first: str, last: str, view: str) -> tuple[list[str], list[str]]:
    before = {r.task_id: r.success for r in results if r.snapshot == first and r.view == view}
    after = {r.task_id: r.success for r in results if r.snapshot == last and r.view == view}
    shared = sorted(before.keys() & after.keys())
    return [t for t in shared if not before[t] and after[t]], [t for t in shared if before[t] and not after[t]]


def render_markdown(summary: Mapping[str, Any], results: Sequence[TaskResult], plots: Mapping[str, Path | None]) -> str:
    """The report, one section after the other."""
    out = [
        *_success_section(summary),
        *_gains_section(summary, plots),
        *_churn_section(summary, results, plots),
        *_cost_section(summary, plots),
    ]
    return "\n".join(out)


def _success_section(summary: Mapping[str, Any]) -> list[str]:
    """The snapshots, success per snapshot and view (macro, micro) and each view by category."""
    names, views = summary["snapshots"], _views(summary)
    info = summary.get("snapshot_info", {})
    out = [
        "# Evaluation report",
        "",
        "Success is the verifier's verdict in %; `overall` is the macro average over categories (micro beside it). "
        "Differences are in percentage points (pp). Process errors are counted apart and never change success.",
        "",
    ]
    out += ["## Snapshots", ""] + _table(
        ["snapshot", "step", "policy version", "interface version"],
        [
            [n, *(str(info.get(n, {}).get(k, "n/a")) for k in ("step", "policy_version", "interface_version"))]
            for n in names
        ],
    )
    out += ["", "## Success per snapshot and view (macro %)", ""]
    out += _table(
        ["snapshot", *views],
        [[n, *(_pct(summary["success"][n].get(v, {}).get("overall")) for v in views)] for n in names],
    )
    out += ["", "Micro (successes / tasks, %):", ""]
    out += _table(
        ["snapshot", *views],
        [[n, *(_pct(summary["success"][n].get(v, {}).get("micro")) for v in views)] for n in names],
    )
    for v in views:
        cats = sorted({c for n in names for c in summary["success"][n].get(v, {}).get("by_category", {})})
        out += ["", f"### View `{v}` by category (%)", ""]
        out += _table(
            ["snapshot", *cats, "macro"],
            [
                [
                    n,
                    *(_pct(summary["success"][n].get(v, {}).get("by_category", {}).get(c)) for c in cats),
                    _pct(summary["success"][n].get(v, {}).get("overall")),
                ]
                for n in names
            ],
        )
    return out


def _gains_section(summary: Mapping[str, Any], plots: Mapping[str, Path | None]) -> list[str]:
    """UVG per snapshot, the ID and OOD gains, and the best-validation snapshot beside the final one."""
    names, views = summary["snapshots"], _views(summary)
    first, final, best = names[0], summary["final"], summary["best_validation"]
    out = ["", "## Gains", "", f"Update-validation view `{summary['views']['validation']}`:", ""]
    out += _table(
        ["snapshot", "UVG_prev", "UVG_base"],
        [[n, _pp(summary["uvg_prev"].get(n)), _pp(summary["uvg_base"].get(n))] for n in names[1:]],
    )
    out += [
        "",
        f"- ID gain ({final} vs {first}, view `{summary['views']['id']}`): {_pp(summary['id_gain'])}",
        f"- OOD gain ({final} vs {first}, view `{summary['views']['ood']}`): {_pp(summary['ood_gain'])}",
        "",
    ]
    if plots.get("validation"):
        out += ["![validation curves](validation.png)", ""]
    out += [
        "## Best validation vs final",
        "",
        "The best-validation snapshot is reported beside the final one, never instead of it.",
        "",
    ]
    out += _table(
        ["", "snapshot", *views],
        [
            [label, n or "n/a", *(_pct(summary["success"].get(n, {}).get(v, {}).get("overall")) for v in views)]
            for label, n in (("best validation", best), ("final", final))
        ],
    )
    return out


def _churn_section(
    summary: Mapping[str, Any], results: Sequence[TaskResult], plots: Mapping[str, Path | None]
) -> list[str]:
    """Forgetting, DeltaFix / DeltaForget and the fix / forget rates, and the tasks that changed."""
    names, views = summary["snapshots"], _views(summary)
    first, final = names[0], summary["final"]
    out = [
        "",
        "## Forgetting and churn",
        "",
        "Forgetting = max(0, replay drop vs previous snapshot). DeltaFix / DeltaForget: share of the tasks present in both "
        "adjacent snapshots that went failed->solved / solved->failed. Fix / forget vs A_0: among tasks A_0 failed / solved, "
        "the share this snapshot solves / fails.",
        "",
    ]
    rows = []
    for n in names[1:]:
        for v in views:
            if v in summary["delta_fix"].get(n, {}) or v in summary["fix_rate"].get(n, {}):
                rows.append(
                    [
                        n,
                        v,
                        _pct(summary["forgetting"].get(n)) if v == summary["views"]["replay"] else "",
                        _pct(summary["delta_fix"][n].get(v)),
                        _pct(summary["delta_forget"][n].get(v)),
                        _pct(summary["fix_rate"][n].get(v)),
                        _pct(summary["forget_rate"][n].get(v)),
                    ]
                )
    out += _table(
        [
            "snapshot",
            "view",
            "forgetting (pp)",
            "DeltaFix %",
            "DeltaForget %",
            f"fix vs {first} %",
            f"forget vs {first} %",
        ],
        rows,
    )
    if plots.get("replay"):
        out += ["", "![replay and churn](replay.png)"]
    out += ["", f"Tasks changed between {first} and {final} (up to 10 ids each):", ""]
    for v in views:
        fixed, forgot = _changed_tasks(results, first, final, v)
        out.append(f"- `{v}`: fixed {len(fixed)} {fixed[:10]}, forgot {len(forgot)} {forgot[:10]}")
    return out


def _cost_section(summary: Mapping[str, Any], plots: Mapping[str, Path | None]) -> list[str]:
    """Cost per snapshot, process diagnostics and the training rounds' plots."""
    names, views = summary["snapshots"], _views(summary)
    out = ["", "## Cost", ""]
    ckeys = (
        "tasks",
        "rollout_tokens_per_task",
        "tool_calls_per_task",
        "eval_wall_s",
        "updates",
        "update_tokens_per_update",
        "train_wall_s",
    )
    out += _table(["snapshot", *ckeys], [[n, *(_num(summary["cost"][n][k]) for k in ckeys)] for n in names])
    out += ["", "![cost](cost.png)", "", "## Process diagnostics", ""]
    dkeys = ("tasks", "timeout", "crash", "context_overflow", "step_limit", "aborted", "failed_with_process_error")
    drows = [
        [n, v, *(str(d[k]) for k in dkeys), _pct(d["overall_excluding_process_errors"])]
        for n in names
        for v in views
        if (d := summary["diagnostics"].get(n, {}).get(v))
    ]
    out += _table(["snapshot", "view", *dkeys, "macro % without process errors"], drows)
    out += ["", "## Training rounds", ""]
    if plots.get("tags"):
        out += ["![tag distribution and weights](tags.png)", "", "![interface timeline](interface.png)"]
    else:
        out.append("No training rounds were given.")
    out += ["", "Per-task results: [results.csv](results.csv); all numbers: [summary.json](summary.json).", ""]
    return out


def write_report(
    summary: Mapping[str, Any],
    per_task_results: Sequence[TaskResult],
    training_rounds: Sequence[Round],
    out_dir: str | Path,
) -> Path:
    """Write report.md, summary.json, results.csv and the PNG plots into out_dir; return report.md's path.

    Plots whose data is absent (no validation or replay view, no training
    rounds) are skipped and the markdown says so instead of embedding them.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = {
        "validation": plot_validation(summary, out / "validation.png"),
        "replay": plot_replay(summary, out / "replay.png"),
        "tags": plot_tags(training_rounds, out / "tags.png"),
        "interface": plot_interface(training_rounds, out / "interface.png"),
        "cost": plot_cost(summary, out / "cost.png"),
    }
    write_task_csv(per_task_results, out / "results.csv")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    path = out / "report.md"
    path.write_text(render_markdown(summary, per_task_results, plots))
    return path
