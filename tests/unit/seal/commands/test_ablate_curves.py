"""`seal ablate`'s learning curves (seal/commands/ablate_curves.py) from hand-made runs:
three snapshots per run, two arms, two seeds."""

import json

from evaluation.frozen import FINAL_TASKS_FILE, FinalTasks, SnapshotRun, final_record, write_final
from seal.commands.ablate_curves import curve_table, curves_markdown, write_curves
from seal.commands.ablate_final import seed_dirs

CATS = {"b1": "base", "b2": "base", "m1": "miss_param", "m2": "miss_param", "r1": "recovery"}
TASKS = FinalTasks(tuple(CATS), ("recovery",), CATS)
STEPS = {"A_0": 0, "A_1": 5, "A_2": 10}


def _run(run_dir, *solved, guideline_step=2, static=False):
    snaps = [
        SnapshotRun(name, {t: (c, t in s) for t, c in CATS.items()}, "same", 1.0, 10) for name, s in zip(STEPS, solved)
    ]
    write_final(run_dir, final_record(snaps, STEPS, TASKS, {"max_new_tokens": 48}))
    with open(run_dir / "evaluation" / FINAL_TASKS_FILE, "w") as f:
        for s in snaps:
            for t, (c, ok) in s.results.items():
                f.write(json.dumps({"snapshot": s.name, "task_id": t, "category": c, "success": ok}) + "\n")
    rows = [
        {
            "step": 1,
            "interface_version": 0,
            "active_guidelines": [],
            "tag_weights": {"pass": 1.0, "spurious_tool_call": 1.0},
        },
        {
            "step": guideline_step,
            "interface_version": 1,
            "active_guidelines": ["active_respond"],
            "tag_weights": {"pass": 1.0, "spurious_tool_call": 1.0 if static else 1.6},
        },
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _runs(tmp_path):
    runs = {"full": seed_dirs(tmp_path, "full", [0, 1]), "vanilla_rl": seed_dirs(tmp_path, "vanilla_rl", [0, 1])}
    _run(runs["full"][0], {"m1"}, {"m1", "b1"}, {"m1", "b1", "m2"})
    _run(runs["full"][1], {"m1"}, {"m1"}, {"m1", "b1", "b2", "r1"}, guideline_step=4)
    _run(runs["vanilla_rl"][0], {"m1"}, {"m1"}, {"m1"}, static=True)
    _run(runs["vanilla_rl"][1], {"m1"}, set(), {"m1", "m2"})
    return runs


def test_curves_pool_seeds_per_step_and_pair_the_arms(tmp_path):
    table = curve_table(_runs(tmp_path))
    held = table["curves"]["held-in (all)"]
    assert [(p["step"], p["successes"], p["n"]) for p in held["full"]] == [(0, 2, 8), (5, 3, 8), (10, 6, 8)]
    assert [(p["step"], p["successes"]) for p in held["vanilla_rl"]] == [(0, 2), (5, 1), (10, 3)]
    assert table["curves"]["recovery"]["full"][-1]["successes"] == 1 and table["held_out"] == ["recovery"]
    d = {p["step"]: p for p in table["differences"]["vanilla_rl"]}
    # step 10, vanilla - full: full alone solves b1, m2 (seed 0), b1, b2 (seed 1); vanilla alone m2 (seed 1)
    assert (d[10]["pairs"], d[10]["second_only"], d[10]["first_only"]) == (8, 1, 4)
    assert d[0]["difference"] == 0.0
    full0 = next(r for r in table["interface"] if r["arm"] == "full" and r["seed"] == 0)
    assert full0["guidelines"] == [{"guideline": "active_respond", "step": 2}]
    assert full0["tag_weights"][0] == {
        "tag": "spurious_tool_call",
        "first": 1.0,
        "last": 1.6,
        "path": [{"step": 1, "weight": 1.0}, {"step": 2, "weight": 1.6}],
    }


def test_the_table_and_the_plot_are_written(tmp_path):
    runs = _runs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    table, text = write_curves(runs, out)
    assert (out / "curves.png").stat().st_size > 10_000 and json.loads((out / "curves.json").read_text()) == table
    assert "| 10 | 75% [" in text and "(6/8)" in text
    assert "- step 10: -37.5 pts [" in text
    assert "| recovery (held out) |" in text
    assert "full seed 1: interface v1; guidelines active_respond (step 4)" in curves_markdown(table)
    # the weight's path: first logged step, then each snapshot step it logged (here the last, step 4)
    assert "spurious_tool_call 1.00 (step 1) -> 1.60 (4)" in text
    assert "vanilla_rl seed 0: interface v1; guidelines active_respond (step 2); tag weights unchanged" in text
