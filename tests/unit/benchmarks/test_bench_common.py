"""benchmarks/_common.py: statistics over repeats, targets, the outside-load probe, tables."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[3]))  # benchmarks/ is not an installed package

from benchmarks._common import LoadProbe, _tree_cpu, summary, table, target


def test_summary_is_median_and_range_and_skips_missing():
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert summary([4, 1, 3, 2])["median"] == 2.5
    assert summary([None, float("nan"), 5.0]) == {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1}
    assert summary([])["median"] is None


def test_target_states_the_measured_figure_against_the_bound():
    assert target("x", 0.95, ">=", 0.9)["met"] is True
    assert target("x", 0.85, ">=", 0.9)["met"] is False
    assert target("x", 2.0, "<", 2.0)["met"] is False
    assert target("x", 0.05, "<=", 0.05)["met"] is True
    assert target("x", None, "<", 2.0) == {"name": "x", "target": "< 2", "measured": None, "met": None}


def _spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def test_our_process_tree_is_counted_as_ours_not_as_outside_load():
    ctx = mp.get_context("fork")
    before = sum(_tree_cpu(os.getpid()).values())
    with LoadProbe(interval_s=0.1) as probe:
        child = ctx.Process(target=_spin, args=(1.0,))
        child.start()
        time.sleep(0.5)
        live = _tree_cpu(os.getpid())
        child.join()
    assert child.pid in live and sum(live.values()) > before  # a live child's CPU time is in the tree
    r = probe.result
    assert r["ours_cpu_share"] > 0 and 0 <= r["other_processes_cpu_share"] <= 1
    assert len(r["loadavg_before"]) == 3 and r["cpus"] >= 1


def _orphan_spinner(cpu_seconds: float, pids) -> None:
    """Start a grandchild that burns ``cpu_seconds`` of CPU, and exit at once: the grandchild
    is reparented away from our tree, as Ray workers are when their raylet stops."""
    pid = os.fork()
    if pid == 0:
        end = time.process_time() + cpu_seconds  # CPU time, not wall: the same work on a loaded machine
        while time.process_time() < end:
            pass
        os._exit(0)
    pids.put(pid)
    time.sleep(0.3)  # long enough for the probe to see the grandchild in our tree


def test_a_reparented_grandchild_still_counts_as_ours():
    ctx = mp.get_context("fork")
    pids = ctx.Queue()
    with LoadProbe(interval_s=0.05) as probe:
        child = ctx.Process(target=_orphan_spinner, args=(1.0, pids))
        child.start()
        grandchild = pids.get(timeout=30)
        child.join()
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
            time.sleep(0.05)  # until the orphan has done its work and exited
    # 1.0 s of CPU, whatever the load: allow for the last interval lost at its exit.
    r = probe.result
    assert r["ours_cpu_share"] * r["cpus"] * r["wall_s"] >= 0.5
    assert r["our_processes_seen"] >= 3


def test_table_aligns_columns_and_prints_missing_values_as_dashes():
    lines = table([("a", 1.234, None), ("longer", 10.0, 3)], ["name", "x", "y"]).splitlines()
    assert lines[0].split() == ["name", "x", "y"] and set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["a", "1.23", "-"] and len({len(l) for l in lines}) == 1


def test_reports_read_back_exactly_and_keep_lines_short():
    import json

    from benchmarks._report import WIDTH, to_json

    report = {
        "speedup": 1.25,
        "spread": {"speedup": {"median": 1.2, "min": 1.1, "max": 1.3, "n": 3}},
        "repeats": [{"t": [0.5] * 40, "note": "x"}],
        "ids": [f"multi_turn_base_{i}" for i in range(200)],
        "empty": [],
        "by_concurrency": {1: {"tokens_s": 10.5, "rows": [{"a": 1}] * 3}, 2: {"tokens_s": 19.0}},
        True: None,
    }
    text = to_json(report)
    assert json.loads(text) == json.loads(json.dumps(report))  # non-string keys become strings, as json writes them
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    assert len(text.splitlines()) * 3 < len(json.dumps(report, indent=2).splitlines())  # ids wrap several to a line
