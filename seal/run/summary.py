"""The note a `seal train` run ends with, readable in ten seconds, also written to
RUN_DIR/summary.txt:

    done: 2 steps in 4 min 12 s; reward 0.00 -> 0.50; policy v2, interface v1; run dir runs/x
    reward by step   ▁█  0.00 -> 0.50 (range 0.00 to 0.50)
    by category      base 0.00 -> 0.50 (first half -> second half of the steps; mean change +0.50)
    failure profile  step 1: empty_turn_model_response 0.75, pass 0.25
                     step 2: pass 0.50, empty_turn_model_response 0.50
    interface        v0 -> v1; guidelines turned on: active_respond (step 2)
    ...
    evaluate         .venv/bin/seal evaluate runs/x && .venv/bin/seal report runs/x

Pure text from the rows of metrics.jsonl (all of the run's steps, resumes
included) and the paths; `seal/commands/train.py` prints it and writes the file.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluation.before_after import held_in_record
from replay.token_ledger import BUCKETS, reached_gradient
from seal.run.progress import duration
from seal.run.step_metrics import sum_token_books
from seal.runtime.storage import resume_checkpoint

BLOCKS = "▁▂▃▄▅▆▇█"
LABEL_WIDTH = 16
SUMMARY_FILE, CURVES_FILE = "summary.txt", "training_curves.png"
SEAL = ".venv/bin/seal"  # the README's entry point


def sparkline(values: Sequence[float | None], width: int = 60, lo: float | None = None, hi: float | None = None) -> str:
    """One block per value (a gap for a missing one); more values than ``width``
    are averaged in equal runs. ``lo``/``hi`` fix the scale (rewards: 0 to 1),
    so a flat line at 0 reads as low, not as the middle."""
    if len(values) > width:
        size = len(values) / width
        runs = [values[int(i * size) : int((i + 1) * size)] for i in range(width)]
        values = [_mean([v for v in run if v is not None]) for run in runs]
    present = [v for v in values if v is not None]
    if not present:
        return " " * len(values)
    low = min(present) if lo is None else min(lo, min(present))
    high = max(present) if hi is None else max(hi, max(present))
    span = high - low
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        else:
            k = 0 if span == 0 else int(round((v - low) / span * (len(BLOCKS) - 1)))
            out.append(BLOCKS[k])
    return "".join(out)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def top_tags(fractions: Mapping[str, float] | None, k: int = 3) -> str:
    """``state_mismatch 0.50, pass 0.25, +2 more``: the largest tag fractions of a step."""
    if not fractions:
        return "no tags"
    ranked = sorted(fractions.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{tag} {frac:.2f}" for tag, frac in ranked[:k])
    return text + (f", +{len(ranked) - k} more" if len(ranked) > k else "")


def category_halves(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per task category, the training reward of the first half of the steps and of the second
    (rollouts pooled by ``rollouts_by_category``; a row without it counts each step once). One
    step's reward is mostly the category its groups drew (on the CPU default 0.00 to 0.83 by
    category alone), so a category compared with itself is what shows the policy changing.
    Categories missing from either half are left out; fewer than two steps: nothing."""
    half = len(rows) // 2
    if half < 1:
        return {}
    sums: list[dict[str, list[float]]] = [{}, {}]
    for i, row in enumerate(rows):
        part = sums[0 if i < half else 1]
        counts = row.get("rollouts_by_category") or {}
        for cat, reward in (row.get("reward_by_category") or {}).items():
            if reward is None:
                continue
            weight = float(counts.get(cat, 1))
            acc = part.setdefault(cat, [0.0, 0.0])
            acc[0] += reward * weight
            acc[1] += weight
    return {
        cat: (sums[0][cat][0] / sums[0][cat][1], sums[1][cat][0] / sums[1][cat][1])
        for cat in sorted(set(sums[0]) & set(sums[1]))
        if sums[0][cat][1] and sums[1][cat][1]
    }


def category_change(halves: Mapping[str, tuple[float, float]]) -> float | None:
    """The second half's reward less the first's, averaged over the categories (None: no category)."""
    return sum(b - a for a, b in halves.values()) / len(halves) if halves else None


def category_text(halves: Mapping[str, tuple[float, float]]) -> str:
    """``base 0.04 -> 0.27, miss_param 0.50 -> 0.83 (first half -> second half; mean change +0.28)``."""
    change = category_change(halves)
    if change is None:
        return "no category in both halves of the run"
    parts = ", ".join(f"{cat} {a:.2f} -> {b:.2f}" for cat, (a, b) in halves.items())
    return f"{parts} (first half -> second half of the steps; mean change {change:+.2f})"


def guidelines_turned_on(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(guideline, the first step whose interface had it), in order of appearance."""
    seen: dict[str, int] = {}
    for row in rows:
        for g in row.get("active_guidelines") or []:
            seen.setdefault(g, int(row["step"]))
    return list(seen.items())


def interface_text(rows: Sequence[Mapping[str, Any]], start: int) -> str:
    """``start``: the interface version the run began with (a row has the version its round ended with)."""
    end = int(rows[-1]["interface_version"])
    head = f"v{start} -> v{end}" if end != start else f"v{start} throughout"
    on = guidelines_turned_on(rows)
    turned = ", ".join(f"{g} (step {s})" for g, s in on) if on else "none"
    tags = {t for r in rows for t in (r.get("tag_fractions") or {})}
    if tags == {"unknown"}:  # a reward-only env (docs/custom-environment.md, the verdict): said, not silent
        turned += (
            " (the env's verdicts carry no diagnosis tags, every turn unknown: the interface and the "
            "A-Patch weights had nothing to act on)"
        )
    return f"{head}; guidelines turned on: {turned}"


def result_line(
    rows: Sequence[Mapping[str, Any]],
    run_dir: Path | str,
    wall_s: float,
    steps_now: int | None = None,
    final: Mapping[str, Any] | None = None,
) -> str:
    """The one line `seal train --quiet` prints: what a script needs to know."""
    first, last = rows[0], rows[-1]
    steps = f"{len(rows)} steps" + (
        f" ({steps_now} this time)" if steps_now is not None and steps_now != len(rows) else ""
    )
    held_in = held_in_record(final["rows"]) if final else None
    test = (
        f"; held-in test success {held_in['before']['rate']:.2f} -> {held_in['after']['rate']:.2f} "
        f"({final['before']} -> {final['after']}, raw interface)"
        if held_in and final
        else ""
    )
    return (
        f"done: {steps} in {duration(wall_s)}; reward {first['reward_mean']:.2f} -> {last['reward_mean']:.2f}{test}; "
        f"policy v{last['policy_version']}, interface v{last['interface_version']}; run dir {run_dir}"
    )


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def final_lines(final: Mapping[str, Any]) -> list[str]:
    """The frozen evaluation's rows: per category, counts, rates with 95% intervals, the paired change."""
    s = final["settings"]
    head = (
        f"{final['before']} -> {final['after']} on the same {final['tasks']} test tasks, raw interface, greedy, "
        f"{s['max_new_tokens']} new tokens/step; [95% intervals]"
    )
    lines = [_row("frozen eval", head)]
    for r in final["rows"]:
        b, a, c = r["before"], r["after"], r["change"]
        label = r["name"] + (" (held out)" if r["held_out"] else "")
        lines.append(
            _row(
                "",
                f"  {label:<20} {b['successes']:>3}/{b['n']:<3} {_pct(b['rate']):>4} [{_pct(b['ci95'][0])}, "
                f"{_pct(b['ci95'][1])}] -> {a['successes']:>3}/{a['n']:<3} {_pct(a['rate']):>4} "
                f"[{_pct(a['ci95'][0])}, {_pct(a['ci95'][1])}]   change {100 * c['value']:+.0f} pts "
                f"[{100 * c['ci95'][0]:+.0f}, {100 * c['ci95'][1]:+.0f}]",
            )
        )
    lines.append(_row("", "  " + verdict(final)))
    means = final.get("reward_mean") or {}
    if final.get("partial_credit") and final["before"] in means and final["after"] in means:
        # Partial credit: success counts the rewards at the env's threshold; the mean moves below it too.
        lines.append(
            _row("", f"  mean reward {means[final['before']]:.2f} -> {means[final['after']]:.2f} (partial credit)")
        )
    curve = final.get("curve") or []
    held = held_in_record(final["rows"])
    if len(curve) > 2 and held:
        points = ", ".join(
            f"{p['name']} (step {p['step']}) {_pct(p['rows'][held['name']]['rate'])}"
            for p in curve
            if held["name"] in p["rows"]
        )
        lines.append(_row("", f"  {held['name']} at every snapshot: {points}"))
    return lines


def verdict(final: Mapping[str, Any]) -> str:
    """One sentence a user reads first: is the trained policy better on test tasks it never trained on?"""
    rows = final["rows"]
    chosen = [r for r in [held_in_record(rows)] if r] + [r for r in rows if r["held_out"]]
    parts = []
    for r in chosen:
        lo, hi = r["change"]["ci95"]
        what = "better" if lo > 0 else "worse" if hi < 0 else "no change the 95% interval can tell from zero"
        parts.append(f"{r['name']}{' (held-out category)' if r['held_out'] else ''}: {what}")
    return f"on unseen test tasks, {final['after']} vs {final['before']}: " + "; ".join(parts)


def infra_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The run's episodes the system ended (never scored), by kind, against every episode played;
    the groups that finished after an invocation's last step count too (its last row's ``_end`` keys)."""
    kinds: Counter[str] = Counter()
    for r in rows:
        for key in ("infra_failures", "infra_failures_end"):
            kinds.update({k: int(v) for k, v in (r.get(key) or {}).items() if v})
    played = sum(int(r.get("episodes_played") or 0) + int(r.get("episodes_played_end") or 0) for r in rows)
    total = sum(kinds.values())
    reissued = sum(int(r.get("fault_reissued_groups") or 0) for r in rows)
    given_up = max((int(r.get("given_up") or 0) for r in rows), default=0)
    if not total:
        return f"none of {played} episodes ended by the system"
    by_kind = ", ".join(f"{k} {n}" for k, n in kinds.most_common())
    return (
        f"{total} of {played} episodes ({total / played:.1%}) ended by the system, not scored ({by_kind}); "
        f"{reissued} groups re-issued, {given_up} tasks given up"
    )


BUCKET_WORDS = {
    "trained": "trained",
    "stale_dropped": "dropped as stale",
    "filtered": "filtered (equal rewards)",
    "update_aborted": "aborted by an update",
    "infra_failed": "infra-failed",
    "lost": "lost with a crash or past the group deadline",
    "in_flight_end": "in flight at the end",
}


def tokens_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """Where the generated tokens went (replay/token_ledger.py), from each invocation's closing books."""
    books = sum_token_books(rows)
    if books is None:
        return "not counted (a run from before the token ledger)"
    share = reached_gradient(books)
    head = f"{share:.0%} of generated tokens reached a gradient" if share is not None else "no tokens generated"
    parts = ", ".join(f"{BUCKET_WORDS[b]} {books[b]}" for b in BUCKETS if books[b] or b == "trained")
    engine = (
        f"; the engine generated {books['generated']}, {books['unattributed']} unattributed{unattributed_why(rows)}"
        if books["generated"] is not None
        else ""
    )
    return f"{head} ({parts}){engine}"


def unattributed_why(rows: Sequence[Mapping[str, Any]]) -> str:
    """What the rows say of a difference between the books and the engine's count
    (replay/token_ledger.py names the only ways it arises); "" when there is none."""
    books = sum_token_books(rows)
    if books is None or not books.get("unattributed"):
        return ""
    why = []
    if any(sum(r.get("lost_groups", {}).values()) or r.get("generator_restores") for r in rows):
        why.append("left with crashed actors or replicas")
    if sum(r.get("infra_failures", {}).get("deadline", 0) for r in rows):
        why.append("requests the episode deadline cut")
    return f" ({'; '.join(why)})" if why else " (no crash or deadline explains it: the books have a gap)"


def _row(label: str, text: str) -> str:
    return f"{label:<{LABEL_WIDTH}} {text}"


def summary_text(
    rows: Sequence[Mapping[str, Any]],
    run_dir: Path | str,
    wall_s: float,
    snapshots: Sequence[Mapping[str, Any]],
    checkpoint: bool,
    curves: bool,
    steps_now: int | None = None,
    final: Mapping[str, Any] | None = None,
) -> str:
    """The closing note; ``rows`` are metrics.jsonl's, oldest first; ``snapshots`` the records of
    snapshots/index.jsonl, whose first (A_0) has the versions the run started from."""
    if not rows:
        raise ValueError("a summary needs at least one learner step")
    run = shlex.quote(str(run_dir))
    rewards = [float(r["reward_mean"]) for r in rows]
    first, last = rows[0], rows[-1]
    trained = [r for r in rows if not r.get("skipped")]
    gen = sum(r.get("gen_tokens_per_s", 0.0) * r.get("step_s", 0.0) for r in rows)
    gen_s = sum(r.get("step_s", 0.0) for r in rows)
    learner = (
        f"{_mean([r['learner_samples_per_s'] for r in trained]):.2f} learner samples/s"
        if trained and all(r.get("learner_samples_per_s") is not None for r in trained)
        else "no learner update"
    )
    filtered = sum(int(r.get("filtered_groups") or 0) for r in rows)
    if snapshots:
        start_policy, start_interface = int(snapshots[0]["policy_version"]), int(snapshots[0]["interface_version"])
    else:  # the version before the first step's update; its interface is not recorded anywhere else
        start_policy = int(first["policy_version"]) - (0 if first.get("skipped") else 1)
        start_interface = int(first["interface_version"])
    lines = [
        result_line(rows, run_dir, wall_s, steps_now, final),
        _row(
            "reward by step",
            f"{sparkline(rewards, lo=0.0, hi=1.0)}  {rewards[0]:.2f} -> {rewards[-1]:.2f} "
            f"(range {min(rewards):.2f} to {max(rewards):.2f})",
        ),
    ]
    if len(rows) > 1:
        lines.append(_row("by category", category_text(category_halves(rows))))
    if final:
        lines += final_lines(final)
    lines.append(_row("failure profile", f"step {first['step']}: {top_tags(first.get('tag_fractions'))}"))
    if len(rows) > 1:
        lines.append(_row("", f"step {last['step']}: {top_tags(last.get('tag_fractions'))}"))
    lines += [
        _row("interface", interface_text(rows, start_interface)),
        _row(
            "policy",
            f"v{start_policy} -> v{last['policy_version']}; {len(rows) - len(trained)} of {len(rows)} "
            # Counted where a step set them aside: one that ends after the last step is under "tokens" (in flight).
            f"steps skipped, {filtered} groups filtered (equal rewards) by the steps",
        ),
    ]
    if any("episodes_played" in r for r in rows):  # rows from before the infra-fault counts have none
        lines.append(_row("infra faults", infra_text(rows)))
    if any(r.get("tokens_run") for r in rows):
        lines.append(_row("tokens", tokens_text(rows)))
    lines += [
        _row("throughput", f"{gen / gen_s if gen_s else 0.0:.1f} generated tokens/s, {learner}"),
        _row(
            "TensorBoard",
            f".venv/bin/tensorboard --logdir {shlex.quote(str(Path(run_dir) / 'tensorboard'))}, "
            "then http://localhost:6006/#custom_scalars",
        ),
        _row(
            "snapshots",
            f"{shlex.quote(str(Path(run_dir) / 'snapshots'))} ({', '.join(r['name'] for r in snapshots) or 'none'})",
        ),
        _row(
            "checkpoint",
            shlex.quote(str(resume_checkpoint(Path(run_dir)))) if checkpoint else "none (trainer.checkpoint_every=0)",
        ),
        _row(
            "metrics",
            shlex.quote(str(Path(run_dir) / "metrics.jsonl"))
            + (f", curves {shlex.quote(str(Path(run_dir) / CURVES_FILE))}" if curves else ""),
        ),
        _row("evaluate", f"{SEAL} evaluate {run} && {SEAL} report {run}"),
    ]
    return "\n".join(lines) + "\n"
