"""`seal ablate`'s table of closing frozen evaluations (seal/commands/ablate_final.py) on hand-made runs."""

import json

import pytest

from evaluation.frozen import FINAL_TASKS_FILE, FinalTasks, SnapshotRun, final_record, write_final
from seal.commands.ablate_final import final_markdown, final_table, seed_dirs

CATS = {"b1": "base", "b2": "base", "m1": "miss_param", "m2": "miss_param", "r1": "recovery"}
TASKS = FinalTasks(tuple(CATS), ("recovery",), CATS)


def _run(run_dir, solved_before, solved_after):
    def snap(name, solved):
        return SnapshotRun(name, {t: (c, t in solved) for t, c in CATS.items()}, "same", 1.0, 10)

    before, after = snap("A_0", solved_before), snap("A_1", solved_after)
    write_final(run_dir, final_record([before, after], {"A_0": 0, "A_1": 5}, TASKS, {"max_new_tokens": 48}))
    with open(run_dir / "evaluation" / FINAL_TASKS_FILE, "w") as f:
        for s in (before, after):
            for t, (c, ok) in s.results.items():
                f.write(json.dumps({"snapshot": s.name, "task_id": t, "category": c, "success": ok}) + "\n")


def test_runs_per_seed_and_the_arms_compared_over_seed_task_pairs(tmp_path):
    runs = {"full": seed_dirs(tmp_path, "full", [0, 1]), "vanilla_rl": seed_dirs(tmp_path, "vanilla_rl", [0, 1])}
    assert runs["full"][1] == tmp_path / "full" / "seed1"
    _run(runs["full"][0], {"m1"}, {"b1", "m1", "m2"})
    _run(runs["full"][1], {"m1"}, {"b1", "b2", "m1", "r1"})
    _run(runs["vanilla_rl"][0], {"m1"}, {"m1"})
    _run(runs["vanilla_rl"][1], {"m1"}, {"m1", "m2"})
    table = final_table(runs)
    first = table["runs"][0]
    assert first["held_in"]["name"] == "held-in (all)"
    assert (first["held_in"]["before"]["successes"], first["held_in"]["after"]["successes"]) == (1, 3)
    assert [h["name"] for h in first["held_out"]] == ["recovery"]
    (c,) = table["comparisons"]
    # 8 (seed, held-in task) pairs; seed 0: full alone on b1, m2; seed 1: full alone on b1, b2; vanilla alone on m2.
    assert (c["pairs"], c["first_only"], c["other_only"]) == (8, 4, 1)
    assert c["difference"] == pytest.approx(3 / 8)
    text = final_markdown(table)
    assert (
        "| full | 0 | 1/4 = 25%" in text
        and "+37.5 pts" in text
        and "(4 solved by full only, 1 by vanilla_rl only)" in text
    )


def test_a_run_without_its_closing_evaluation_is_named(tmp_path):
    (tmp_path / "full").mkdir()
    with pytest.raises(FileNotFoundError, match="no closing evaluation"):
        final_table({"full": {None: tmp_path / "full"}})
