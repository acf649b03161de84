"""RUN_DIR/training_curves.png: reward, loss, KL, grad norm, tag weights and tag
fractions by learner step, from the rows of metrics.jsonl. matplotlib is
imported here only (`seal --help` stays instant)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

NAN = float("nan")


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    # Skipped steps have no loss, KL or grad norm: a gap in the line, not a zero.
    return [NAN if r.get(key) is None else float(r[key]) for r in rows]


def _by_tag(rows: Sequence[Mapping[str, Any]], group: str, missing: float) -> dict[str, list[float]]:
    tags = sorted({t for r in rows for t in (r.get(group) or {})})
    return {t: [missing if (v := (r.get(group) or {}).get(t)) is None else float(v) for r in rows] for t in tags}


def plot_training(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    from matplotlib.figure import Figure

    if not rows:
        raise ValueError("no learner steps to plot")
    steps = [int(r["step"]) for r in rows]
    fig = Figure(figsize=(13, 7), layout="constrained")
    axes = fig.subplots(2, 3, sharex=True)
    reward = axes[0][0]
    reward.plot(steps, _series(rows, "reward_mean"), marker="o", label="all groups")
    reward.plot(steps, _series(rows, "trained_reward_mean"), marker=".", linestyle="--", label="trained groups")
    reward.set(title="reward (mean)", ylim=(-0.03, 1.03))
    reward.legend(fontsize=8)
    for ax, key, title in (
        (axes[0][1], "loss", "loss"),
        (axes[0][2], "kl", "KL"),
        (axes[1][0], "grad_norm", "grad norm"),
    ):
        ax.plot(steps, _series(rows, key), marker="o")
        ax.set(title=title)
    # A tag absent from a step's failure profile had fraction 0; a weight never reported is unknown.
    for ax, group, missing, title in (
        (axes[1][1], "tag_weights", NAN, "tag weights (A-Patch)"),
        (axes[1][2], "tag_fractions", 0.0, "tag fractions (failure profile)"),
    ):
        for tag, ys in _by_tag(rows, group, missing).items():
            ax.plot(steps, ys, marker=".", label=tag)
        ax.set(title=title)
        if group == "tag_fractions":
            ax.set_ylim(-0.03, 1.03)
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set(xlabel="learner step")
    for ax in (a for row in axes for a in row):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path
