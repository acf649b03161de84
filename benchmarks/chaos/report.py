"""What a soak found (benchmarks/chaos/soak.py): faults by kind, the run's steps and groups (lost and
trained twice, benchmarks/chaos/ledger.py), the token books, fault-to-trained-step times, each
process kind's memory, descriptors and threads, whether every checkpoint and snapshot on disk loads,
and how each invocation ended. ``summarise`` builds the JSON; ``render`` the table."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.chaos.ledger import account, dropped_slots, given_up_slots

MEASURES = ("rss_kb", "fds", "threads")
OOM = "were killed due to the node running low on memory"
EDGE_S = 180.0  # RSS at either end of a window: the median of this many seconds of samples
WARM_S = 600.0  # a process's first minutes (start-up, first steps) are not counted as settled growth


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None with fewer than 3 points or no spread in x."""
    if len(points) < 3:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return None if var == 0 else sum((x - mx) * (y - my) for x, y in points) / var


def processes(
    samples: list[dict[str, Any]], end_t: float, tail_from_t: float | None = None
) -> dict[str, dict[str, Any]]:
    """Per kind: the first and last reading, the per-step slope of each measure (median over the
    kind's processes that lived 20 steps or more), and RSS growth over the soak's tail (from
    ``tail_from_t``; by default its last half) in the process of that kind that covered most of it."""
    by_pid: dict[tuple[str, int], list[dict]] = {}
    for s in samples:
        by_pid.setdefault((s["kind"], s["pid"]), []).append(s)
    out: dict[str, dict[str, Any]] = {}
    tail_from = end_t / 2 if tail_from_t is None else tail_from_t
    for kind in sorted({k for k, _ in by_pid}):
        lives = [v for (k, _), v in by_pid.items() if k == kind]
        first = min(lives, key=lambda v: v[0]["t"])[0]
        last = max(lives, key=lambda v: v[-1]["t"])[-1]
        row: dict[str, Any] = {"processes": len(lives)}
        for m in MEASURES:
            slopes = [
                s
                for v in lives
                if v[-1]["step"] - v[0]["step"] >= 20 and (s := _slope([(x["step"], x[m]) for x in v])) is not None
            ]
            row[m] = {"start": first[m], "end": last[m], "per_step": statistics.median(slopes) if slopes else None}
        late = [[x for x in v if x["t"] >= tail_from] for v in lives]
        late = [v for v in late if len(v) >= 2]
        if late:
            v = max(late, key=lambda v: v[-1]["t"] - v[0]["t"])
            life_start = next(life[0]["t"] for life in lives if life[0]["pid"] == v[0]["pid"])
            row["rss_tail"] = {"pid": v[0]["pid"], "from_s": round(tail_from, 1), **_growth(v)}
            # Start-up fills caches and allocator arenas for minutes: growth after that is the leak signal.
            settled = [x for x in v if x["t"] >= life_start + WARM_S]
            if len(settled) >= 2:
                row["rss_tail"]["settled"] = _growth(settled)
        out[kind] = row
    return out


def _growth(v: list[dict[str, Any]]) -> dict[str, Any]:
    """RSS from the median of the first EDGE_S of ``v`` to the median of its last EDGE_S (one
    sample's transient peak is not growth), and the peak. Also the floor's growth, from the least
    reading of the first EDGE_S to the least of the last: a learner's RSS swings by a step's
    activations (hundreds of MB, freed after each step), so where a sample falls in a step moves
    the medians; what the process keeps between steps is the floor, the leak signal."""
    head = [x["rss_kb"] for x in v if x["t"] <= v[0]["t"] + EDGE_S]
    tail = [x["rss_kb"] for x in v if x["t"] >= v[-1]["t"] - EDGE_S]
    a, b = statistics.median(head), statistics.median(tail)
    return {
        "minutes": round((v[-1]["t"] - v[0]["t"]) / 60, 1),
        "from_kb": a,
        "to_kb": b,
        "max_kb": max(x["rss_kb"] for x in v),
        "growth": b / a - 1 if a else None,
        "floor_growth": min(tail) / min(head) - 1 if min(head) else None,
    }


def fault_recovery(injected: list[dict], rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Seconds from each fault to the next trained step (of any invocation), by kind."""
    trained = sorted(r["t"] for r in rows if r["row"].get("trained_groups", 0) > 0)
    per: dict[str, list[float]] = {}
    for f in injected:
        after = [t for t in trained if t > f["t"]]
        per.setdefault(f["kind"], []).append(round(after[0] - f["t"], 1) if after else None)
    return {
        k: {
            "median_s": statistics.median([x for x in v if x is not None]) if any(x is not None for x in v) else None,
            "max_s": max((x for x in v if x is not None), default=None),
            "no_step_after": sum(x is None for x in v),
        }
        for k, v in per.items()
    }


def token_books(rows: list[dict]) -> dict[str, Any]:
    """The ledger's books (replay/token_ledger.py) of the invocations that closed them (ended on their
    own), and what the invocations a fault ended had generated without a close."""
    closed = [r["row"]["tokens_run"] for r in rows if "tokens_run" in r["row"]]
    closed_inv = {r["invocation"] for r in rows if "tokens_run" in r["row"]}
    open_generated = sum(
        (r["row"].get("tokens") or {}).get("generated") or 0 for r in rows if r["invocation"] not in closed_inv
    )
    return {
        "closed_invocations": len(closed),
        "generated": sum(b.get("generated", 0) for b in closed),
        "unattributed": sum(b.get("unattributed", 0) for b in closed),
        "generated_in_invocations_a_fault_ended": open_generated,
    }


def check_storage(storage: Path, run_dir: Path) -> dict[str, Any]:
    """Every checkpoint and snapshot on the storage, loaded: learner.json, the learner's state and RNG
    streams; each indexed snapshot's weights (safetensors). Snapshot folders no index line names
    (a write that failed part way) are counted, not loaded: nothing reads them."""
    import torch
    from safetensors.torch import load_file

    result: dict[str, Any] = {"checkpoints": {}, "snapshots": {}, "unindexed_snapshot_dirs": []}
    for meta in sorted((storage / "checkpoints").glob("*/learner.json")):
        name = meta.parent.name
        try:
            info = json.loads(meta.read_text())
            state = torch.load(meta.parent / "torch_state.pt", weights_only=False)
            torch.load(meta.parent / "rng.pt", weights_only=False)
            assert {"model", "optimizer"} <= set(state), f"torch_state.pt holds {sorted(state)}"
            result["checkpoints"][name] = {"loads": True, "step": info["step"]}
        except Exception as exc:  # any failure to load is the finding
            result["checkpoints"][name] = {"loads": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    index = run_dir / "snapshots" / "index.jsonl"
    records = [json.loads(x) for x in index.read_text().splitlines() if x.strip()] if index.is_file() else []
    indexed = set()
    for rec in records:
        if rec["name"] == "A_0":
            continue
        path = Path(rec["weights"]) if Path(rec["weights"]).is_absolute() else run_dir / rec["weights"]
        # The snapshot's folder under snapshots/ (its weights sit one level down, e.g. A_1/v000028).
        parts = path.parts
        indexed.add(parts[parts.index("snapshots") + 1] if "snapshots" in parts else path.name)
        try:
            tensors = sum(len(load_file(f)) for f in sorted(path.glob("*.safetensors")))
            assert tensors > 0, f"no safetensors in {path}"
            result["snapshots"][rec["name"]] = {"loads": True, "tensors": tensors}
        except Exception as exc:
            result["snapshots"][rec["name"]] = {"loads": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    snap_root = storage / "snapshots"
    if snap_root.is_dir():
        result["unindexed_snapshot_dirs"] = sorted(
            p.name for p in snap_root.iterdir() if p.is_dir() and p.name not in indexed
        )
    result["all_load"] = all(v["loads"] for part in ("checkpoints", "snapshots") for v in result[part].values())
    return result


def raw(soak) -> dict[str, Any]:
    """What the soak recorded, with what only its storage holds (the final checkpoint's position, the
    load check) read while the tmpfs is still mounted: ``summarise`` works from this alone (raw.json)."""
    meta_file = soak.storage / "checkpoints" / "latest" / "learner.json"
    try:
        storage = check_storage(soak.storage, soak.run_dir)
    except Exception as exc:  # the report still comes out
        storage = {
            "checkpoints": {},
            "snapshots": {},
            "unindexed_snapshot_dirs": [],
            "all_load": False,
            "error": repr(exc),
        }
    return {
        "out": str(soak.out),
        "seconds": round(soak.now(), 1),
        "invocations": [inv.record() for inv in soak.invocations],
        "logs": [str(inv.log) for inv in soak.invocations],
        "final": json.loads(meta_file.read_text())["extra"] if meta_file.is_file() else None,
        "storage": storage,
        "rows": soak.rows,
        "injected": soak.injected,
        "samples": soak.samples,
        "not_injected": getattr(soak, "not_injected", []),
        "torn_rows": soak.torn_rows,
        "steady_from_s": soak.steady_from_s,
    }


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    out = Path(raw["out"])
    invocations, final, rows, injected = raw["invocations"], raw["final"], raw["rows"], raw["injected"]
    trained = out / "trained.jsonl"
    records = [json.loads(x) for x in trained.read_text().splitlines() if x.strip()] if trained.is_file() else []
    logs = [line for log in raw["logs"] for line in Path(log).read_text(errors="replace").splitlines()]
    groups = (
        account(
            records,
            {i["index"]: i["resumed_from"] for i in invocations},
            int(final["step"]),
            int(final["slots"]["low"]),
            final["slots"]["done"],
            given_up_slots(logs),
            dropped_slots(logs),
        )
        if final
        else {"error": "no checkpoint at the end"}
    )
    last_rows: dict[int, dict] = {}
    for r in rows:
        last_rows[r["invocation"]] = r["row"]
    taken = Counter(p.name.split("-")[0] for p in (out / "triggers").glob("*.taken-*"))
    return {
        "seconds": raw["seconds"],
        "seed": raw.get("seed"),  # soaks recorded before 2026-12-07 kept it in chaos.json only
        "faults": dict(Counter(f["kind"] for f in injected)),
        "faults_total": len(injected),
        "disk_full_not_hit": sum(bool(f.get("not_hit")) for f in injected),
        "triggers_claimed": dict(taken),
        "not_injected": raw["not_injected"],
        "steps": int(final["step"]) if final else None,
        "rows": len(rows),
        "groups": groups,
        "reissued": sum(r.get("reissued", 0) for r in last_rows.values()),
        "given_up_counter": sum(r.get("given_up", 0) for r in last_rows.values()),
        "tokens": token_books(rows),
        "fault_to_trained_step": fault_recovery(injected, rows),
        "processes": processes(raw["samples"], raw["seconds"], raw.get("steady_from_s")),
        "storage": raw["storage"],
        "invocations": invocations,
        "completed": bool(invocations) and invocations[-1]["rc"] == 0,
        "unexpected_exits": [i["index"] for i in invocations[:-1] if not i["ended_by"]],
        "torn_metrics_lines": raw["torn_rows"],
        # Not the soak's: Ray's memory monitor killing workers when the whole (shared) machine nears 95%.
        "ray_oom_kills": sum(OOM in line for line in logs),
        "injected": injected,
    }


def render(report: dict[str, Any]) -> str:
    g, t = report["groups"], report["tokens"]
    lines = [
        f"soak {report['seconds'] / 60:.1f} min, seed {report.get('seed')}: {report['faults_total']} faults, "
        f"{report['steps']} steps, {len(report['invocations'])} invocations, completed: {report['completed']}, "
        f"unexpected exits: {report['unexpected_exits'] or 'none'}",
        f"outside the schedule: Ray's OOM killer struck {report.get('ray_oom_kills', 0)} time(s) (the machine's memory)",
        "faults: "
        + ", ".join(f"{k} {v}" for k, v in sorted(report["faults"].items()))
        + (f" (disk_full not hit: {report['disk_full_not_hit']})" if report["disk_full_not_hit"] else ""),
        f"groups: trained {g.get('groups_trained')}, re-issued {report['reissued']}, given up {g.get('groups_given_up')}, "
        f"dropped as stale {g.get('groups_dropped_stale')}, "
        f"lost {len(g.get('groups_lost', []))}, trained twice {len(g.get('groups_trained_twice', []))}, "
        f"trained but not finished {len(g.get('trained_not_finished', []))}; steps discarded by rewinds {g.get('discarded_steps')}",
        f"tokens: unattributed {t['unattributed']} of {t['generated']} in {t['closed_invocations']} closed invocation(s); "
        f"{t['generated_in_invocations_a_fault_ended']} generated in invocations a fault ended",
        "",
        f"{'fault':<16}{'count':>6}{'to trained step: median s':>28}{'max s':>8}",
    ]
    for kind, rec in sorted(report["fault_to_trained_step"].items()):
        lines.append(f"{kind:<16}{report['faults'].get(kind, 0):>6}{_f(rec['median_s']):>28}{_f(rec['max_s']):>8}")
    lines += [
        "",
        f"{'process':<18}{'n':>3}{'RSS MB start/end':>18}{'KB/step':>9}{'fds':>10}{'/step':>7}{'threads':>9}{'/step':>7}  RSS over the tail (settled: after {WARM_S / 60:.0f} min of life)",
    ]
    for kind, p in report["processes"].items():
        r, f, th = p["rss_kb"], p["fds"], p["threads"]
        tail_s = _tail_text(p.get("rss_tail"))
        lines.append(
            f"{kind:<18}{p['processes']:>3}{r['start'] / 1024:>9.0f}/{r['end'] / 1024:<8.0f}{_f(r['per_step']):>9}"
            f"{f['start']:>5}/{f['end']:<4}{_f(f['per_step'], 3):>7}{th['start']:>5}/{th['end']:<3}{_f(th['per_step'], 3):>7}  {tail_s}"
        )
    st = report["storage"]
    lines += [
        "",
        f"storage: checkpoints {_checkpoints(st['checkpoints'])}; "
        f"snapshots loading {sum(v['loads'] for v in st['snapshots'].values())}/{len(st['snapshots'])}; "
        f"unindexed snapshot folders {len(st['unindexed_snapshot_dirs'])}; all load: {st['all_load']}",
        "",
        "invocations (rc, ended by, left-over processes, last line):",
    ]
    for inv in report["invocations"]:
        lines.append(
            f"  #{inv['index']} from step {inv['resumed_from']}, {inv['seconds']:.0f} s: rc {inv['rc']}, "
            f"{inv['ended_by'] or '-'}, {inv['leftover_processes']} left; {inv['last_line'][:160]}"
        )
    return "\n".join(lines)


def _tail_text(tail: dict[str, Any] | None) -> str:
    if not tail or tail["growth"] is None:
        return "-"
    said = f"{tail['growth']:+.1%} over {tail['minutes']} min"
    settled = tail.get("settled")
    if not settled:
        return said
    floor = settled.get("floor_growth")
    floor_text = f", floor {floor:+.1%}" if floor is not None else ""
    return said + f" (settled {settled['growth']:+.1%}{floor_text} over {settled['minutes']} min)"


def _checkpoints(found: dict[str, dict]) -> str:
    said = [f"{k}: step {v['step']}" if v["loads"] else f"{k}: FAILS {v['error']}" for k, v in found.items()]
    return ", ".join(said) or "none"


def _f(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
