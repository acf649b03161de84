"""SEAGym-style metrics over per-task results (docs/design.md, evaluation).

Pure functions: records in, numbers out, no model and no I/O, so a report can
be recomputed from a run's stored CSV. Conventions used throughout:

- Perf(E_i) on a view is the macro average over categories of per-category
  success rate (every category counts equally however many tasks it has); the
  micro rate (successes / tasks) is reported beside it.
- Snapshots are ordered by learner step (stable, so a "final" snapshot with
  the same step as the last A_i stays after it); the first is A_0, the last is
  the final snapshot.
- Metrics that compare snapshot i with i-1 or with A_0 are keyed by the name of
  snapshot i and exist for i >= 1 only. A value is None when it cannot be
  computed (view not run, or an empty denominator), never a silent 0.
- Process diagnostics (timeouts, crashes, context overflows) never change a
  task's success: such a task keeps the verifier's verdict and stays in every
  denominator; diagnostics count them apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from evaluation.records import ID_TEST, OOD_TEST, REPLAY, VALIDATION, SnapshotInfo, TaskResult

Outcomes = dict[str, bool]  # task_id -> success, one snapshot on one view


def index_results(results: Iterable[TaskResult]) -> dict[str, dict[str, dict[str, TaskResult]]]:
    """snapshot -> view -> task_id -> result. A task run twice is an error:
    silently keeping one of two runs would bias every rate computed after."""
    table: dict[str, dict[str, dict[str, TaskResult]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:
        tasks = table[r.snapshot][r.view]
        if r.task_id in tasks:
            raise ValueError(f"task {r.task_id!r} appears twice for snapshot {r.snapshot!r} view {r.view!r}")
        tasks[r.task_id] = r
    return {s: dict(v) for s, v in table.items()}


def order_snapshots(snapshots: Iterable[SnapshotInfo]) -> list[SnapshotInfo]:
    ordered = sorted(snapshots, key=lambda s: s.step)
    names = [s.name for s in ordered]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate snapshot names in {names}")
    return ordered


def view_success(tasks: Iterable[TaskResult]) -> dict[str, Any]:
    """Success of one snapshot on one view.

    Returns {"overall": macro over categories, "micro": successes / tasks,
    "n": tasks, "by_category": {category: rate}, "n_by_category": {category: n}}.
    """
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # category -> [solved, total]
    for t in tasks:
        counts[t.category][0] += int(t.success)
        counts[t.category][1] += 1
    if not counts:
        raise ValueError("no tasks: success of an empty view is undefined")
    by_category = {c: solved / total for c, (solved, total) in sorted(counts.items())}
    n = sum(total for _, total in counts.values())
    return {
        "overall": sum(by_category.values()) / len(by_category),
        "micro": sum(solved for solved, _ in counts.values()) / n,
        "n": n,
        "by_category": by_category,
        "n_by_category": {c: total for c, (_, total) in sorted(counts.items())},
    }


def success_table(
    indexed: Mapping[str, Mapping[str, Mapping[str, TaskResult]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """snapshot -> view -> view_success(...) for every (snapshot, view) that was run."""
    return {s: {v: view_success(tasks.values()) for v, tasks in sorted(views.items())} for s, views in indexed.items()}


def perf(success: Mapping[str, Mapping[str, Mapping[str, Any]]], snapshot: str, view: str) -> float | None:
    entry = success.get(snapshot, {}).get(view)
    return None if entry is None else entry["overall"]


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def uvg_prev(perfs: Sequence[float | None], names: Sequence[str]) -> dict[str, float | None]:
    """UVG_prev(i) = Perf(E_i) - Perf(E_{i-1}) for i >= 1, on the update-validation view."""
    return {names[i]: _diff(perfs[i], perfs[i - 1]) for i in range(1, len(names))}


def uvg_base(perfs: Sequence[float | None], names: Sequence[str]) -> dict[str, float | None]:
    """UVG_base(i) = Perf(E_i) - Perf(E_0) for i >= 1, on the update-validation view."""
    return {names[i]: _diff(perfs[i], perfs[0]) for i in range(1, len(names))}


def forgetting(replay_perfs: Sequence[float | None], names: Sequence[str]) -> dict[str, float | None]:
    """Forgetting rate at i >= 1: max(0, Perf_replay(E_{i-1}) - Perf_replay(E_i)).

    Only drops count: a replay gain is 0 forgetting, not negative forgetting,
    so gains elsewhere cannot cancel a drop when these are summed over a run.
    """
    out: dict[str, float | None] = {}
    for i in range(1, len(names)):
        drop = _diff(replay_perfs[i - 1], replay_perfs[i])
        out[names[i]] = None if drop is None else max(0.0, drop)
    return out


def churn(prev: Outcomes, cur: Outcomes) -> tuple[float | None, float | None]:
    """(DeltaFix, DeltaForget) between adjacent snapshots on one view.

    Denominator for both: the tasks present in both snapshots (all of them,
    solved or not), so DeltaFix - DeltaForget is the micro success change on
    those tasks. DeltaFix = share failed at i-1 and solved at i; DeltaForget =
    share solved at i-1 and failed at i. (None, None) when no task is shared.
    """
    shared = prev.keys() & cur.keys()
    if not shared:
        return None, None
    fixed = sum(1 for t in shared if not prev[t] and cur[t])
    forgot = sum(1 for t in shared if prev[t] and not cur[t])
    return fixed / len(shared), forgot / len(shared)


def fix_forget_vs_base(base: Outcomes, cur: Outcomes) -> tuple[float | None, float | None]:
    """(fix rate, forget rate) of a snapshot against A_0 on one view.

    Over the tasks present in both: fix = among tasks A_0 failed, the share
    the snapshot solves; forget = among tasks A_0 solved, the share the
    snapshot fails. Each is None when its denominator is empty (e.g. A_0
    solved everything: nothing to fix), since 0 would read as "fixed none".
    """
    shared = base.keys() & cur.keys()
    failed = [t for t in shared if not base[t]]
    solved = [t for t in shared if base[t]]
    fix = sum(1 for t in failed if cur[t]) / len(failed) if failed else None
    forget = sum(1 for t in solved if not cur[t]) / len(solved) if solved else None
    return fix, forget


def best_validation(perfs: Sequence[float | None], names: Sequence[str]) -> str | None:
    """Snapshot with the highest update-validation Perf; ties go to the earliest
    (fewer updates for the same score). None when no snapshot was validated."""
    best: tuple[float, str] | None = None
    for p, name in zip(perfs, names):
        if p is not None and (best is None or p > best[0]):
            best = (p, name)
    return None if best is None else best[1]


def cost(
    indexed: Mapping[str, Mapping[str, Mapping[str, TaskResult]]], ordered: Sequence[SnapshotInfo]
) -> dict[str, dict[str, Any]]:
    """Per snapshot: evaluation cost over all its task runs (every view) and
    training cost of the interval since the previous snapshot.

    update_tokens_per_update = (update_tokens_i - update_tokens_{i-1}) /
    (step_i - step_{i-1}); for the first snapshot the previous is the run start
    (0 tokens, step 0). None when the interval holds no update.
    """
    out: dict[str, dict[str, Any]] = {}
    prev_step, prev_tokens, prev_wall = 0, 0, 0.0
    for snap in ordered:
        tasks = [t for view in indexed.get(snap.name, {}).values() for t in view.values()]
        n = len(tasks)
        gen = sum(t.generated_tokens for t in tasks)
        prompt = sum(t.prompt_tokens for t in tasks)
        calls = sum(t.tool_calls for t in tasks)
        wall = sum(t.wall_s for t in tasks)
        updates = snap.step - prev_step
        tokens = snap.update_tokens - prev_tokens
        out[snap.name] = {
            "tasks": n,
            "rollout_tokens_per_task": (gen + prompt) / n if n else None,
            "generated_tokens_per_task": gen / n if n else None,
            "prompt_tokens_per_task": prompt / n if n else None,
            "tool_calls": calls,
            "tool_calls_per_task": calls / n if n else None,
            "eval_wall_s": wall,
            "eval_wall_s_per_task": wall / n if n else None,
            "updates": updates,
            "update_tokens": tokens,
            "update_tokens_per_update": tokens / updates if updates > 0 else None,
            "train_wall_s": snap.wall_s - prev_wall,
            "train_wall_s_total": snap.wall_s,
        }
        prev_step, prev_tokens, prev_wall = snap.step, snap.update_tokens, snap.wall_s
    return out


def classify_process(t: TaskResult) -> list[str]:
    """Diagnostic labels of one task run (empty when the run was clean).

    A process error whose text mentions a timeout is a timeout, any other is a
    crash. Context overflow and step limit come from the episode outcome; an
    aborted outcome without a recorded error is counted as "aborted".
    """
    labels: list[str] = []
    if t.process_error is not None:
        text = t.process_error.lower()
        labels.append("timeout" if ("timeout" in text or "timed out" in text) else "crash")
    if t.outcome == "context_overflow":
        labels.append("context_overflow")
    elif t.outcome == "step_limit":
        labels.append("step_limit")
    elif t.outcome == "aborted" and t.process_error is None:
        labels.append("aborted")
    return labels


DIAGNOSTIC_LABELS: tuple[str, ...] = ("timeout", "crash", "context_overflow", "step_limit", "aborted")


def diagnostics(indexed: Mapping[str, Mapping[str, Mapping[str, TaskResult]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """snapshot -> view -> counts of each diagnostic label, plus "process_errors"
    (timeouts + crashes), "failed_with_process_error", and
    "overall_excluding_process_errors": macro success over the runs without a
    process error (None if none is left), to show how much errors cost."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for snap, views in indexed.items():
        out[snap] = {}
        for view, tasks in sorted(views.items()):
            counts = {label: 0 for label in DIAGNOSTIC_LABELS}
            for t in tasks.values():
                for label in classify_process(t):
                    counts[label] += 1
            errored = [t for t in tasks.values() if t.process_error is not None]
            clean = [t for t in tasks.values() if t.process_error is None]
            out[snap][view] = {
                "tasks": len(tasks),
                **counts,
                "process_errors": len(errored),
                "failed_with_process_error": sum(1 for t in errored if not t.success),
                "overall_excluding_process_errors": view_success(clean)["overall"] if clean else None,
            }
    return out


def _outcomes(indexed, snapshot: str, view: str) -> Outcomes | None:
    tasks = indexed.get(snapshot, {}).get(view)
    return None if tasks is None else {tid: t.success for tid, t in tasks.items()}


def summarize(
    results: Iterable[TaskResult],
    snapshots: Iterable[SnapshotInfo],
    *,
    validation_view: str = VALIDATION,
    id_view: str = ID_TEST,
    ood_view: str = OOD_TEST,
    replay_view: str = REPLAY,
) -> dict[str, Any]:
    """Every metric of docs/design.md's evaluation section as one JSON-serialisable dict.

    Keys: snapshots (names in step order), success, uvg_prev, uvg_base,
    forget_rate and fix_rate (snapshot -> view -> rate vs A_0), cost,
    best_validation, final, delta_fix and delta_forget (snapshot -> view),
    forgetting (snapshot -> replay forgetting rate), id_gain, ood_gain,
    diagnostics (snapshot -> view -> counts), snapshot_info (name ->
    SnapshotInfo dict), views (role -> view name used).
    """
    ordered = order_snapshots(snapshots)
    if not ordered:
        raise ValueError("summarize needs at least one snapshot")
    names = [s.name for s in ordered]
    indexed = index_results(results)
    unknown = set(indexed) - set(names)
    if unknown:
        raise ValueError(f"results name snapshots without a SnapshotInfo: {sorted(unknown)}")

    success = success_table(indexed)
    diag = diagnostics(indexed)
    val = [perf(success, n, validation_view) for n in names]
    replay = [perf(success, n, replay_view) for n in names]
    first, last = names[0], names[-1]

    delta_fix: dict[str, dict[str, float | None]] = {}
    delta_forget: dict[str, dict[str, float | None]] = {}
    fix_rate: dict[str, dict[str, float | None]] = {}
    forget_rate: dict[str, dict[str, float | None]] = {}
    for i in range(1, len(names)):
        cur_name, prev_name = names[i], names[i - 1]
        delta_fix[cur_name], delta_forget[cur_name] = {}, {}
        fix_rate[cur_name], forget_rate[cur_name] = {}, {}
        for view in sorted(indexed.get(cur_name, {})):
            cur = _outcomes(indexed, cur_name, view)
            assert cur is not None  # the view is one of cur_name's
            prev = _outcomes(indexed, prev_name, view)
            base = _outcomes(indexed, first, view)
            if prev is not None:
                delta_fix[cur_name][view], delta_forget[cur_name][view] = churn(prev, cur)
            if base is not None:
                fix_rate[cur_name][view], forget_rate[cur_name][view] = fix_forget_vs_base(base, cur)

    return {
        "snapshots": names,
        "success": {n: success.get(n, {}) for n in names},
        "uvg_prev": uvg_prev(val, names),
        "uvg_base": uvg_base(val, names),
        "forget_rate": forget_rate,
        "fix_rate": fix_rate,
        "cost": cost(indexed, ordered),
        "best_validation": best_validation(val, names),
        "final": last,
        "delta_fix": delta_fix,
        "delta_forget": delta_forget,
        "forgetting": forgetting(replay, names),
        "id_gain": _diff(perf(success, last, id_view), perf(success, first, id_view)),
        "ood_gain": _diff(perf(success, last, ood_view), perf(success, first, ood_view)),
        "diagnostics": {n: diag.get(n, {}) for n in names},
        "snapshot_info": {s.name: s.to_dict() for s in ordered},
        "views": {"validation": validation_view, "id": id_view, "ood": ood_view, "replay": replay_view},
    }
