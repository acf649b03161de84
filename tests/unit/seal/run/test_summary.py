"""The closing note of `seal train` (seal/run/summary.py) and its training curves (seal/run/plot.py)."""

from __future__ import annotations

import pytest

from seal.run.summary import (
    BLOCKS,
    category_halves,
    category_text,
    guidelines_turned_on,
    interface_text,
    result_line,
    sparkline,
    summary_text,
    top_tags,
)

SNAPSHOTS = [
    {"name": "A_0", "step": 0, "policy_version": 0, "interface_version": 0},
    {"name": "A_1", "step": 3, "policy_version": 2, "interface_version": 2},
]


def rows():
    return [
        {
            "step": 1,
            "reward_mean": 0.0,
            "trained_reward_mean": None,
            "policy_version": 0,
            "interface_version": 0,
            "active_guidelines": [],
            "skipped": True,
            "filtered_groups": 2,
            "loss": None,
            "kl": None,
            "grad_norm": None,
            "tag_fractions": {"empty_turn_model_response": 0.75, "state_mismatch": 0.25},
            "tag_weights": None,
            "gen_tokens_per_s": 4.0,
            "step_s": 100.0,
            "learner_samples_per_s": None,
        },
        {
            "step": 2,
            "reward_mean": 0.5,
            "trained_reward_mean": 0.5,
            "policy_version": 1,
            "interface_version": 1,
            "active_guidelines": ["active_respond"],
            "skipped": False,
            "filtered_groups": 1,
            "loss": 0.01,
            "kl": 0.001,
            "grad_norm": 0.3,
            "tag_fractions": {"pass": 0.5, "state_mismatch": 0.3, "empty_turn_model_response": 0.1, "format": 0.1},
            "tag_weights": {"pass": 1.0, "state_mismatch": 1.2},
            "gen_tokens_per_s": 8.0,
            "step_s": 100.0,
            "learner_samples_per_s": 0.5,
        },
        {
            "step": 3,
            "reward_mean": 1.0,
            "trained_reward_mean": 1.0,
            "policy_version": 2,
            "interface_version": 2,
            "active_guidelines": ["active_respond", "state_aware"],
            "skipped": False,
            "filtered_groups": 0,
            "loss": 0.02,
            "kl": 0.002,
            "grad_norm": 0.2,
            "tag_fractions": {"pass": 1.0},
            "tag_weights": {"pass": 1.0, "state_mismatch": 1.3},
            "gen_tokens_per_s": 6.0,
            "step_s": 200.0,
            "learner_samples_per_s": 0.7,
        },
    ]


def test_sparkline_scales_and_compresses():
    assert sparkline([0.0, 0.5, 1.0]) == BLOCKS[0] + BLOCKS[4] + BLOCKS[-1]
    assert sparkline([0.0, 0.0], lo=0.0, hi=1.0) == BLOCKS[0] * 2  # a flat line at 0 reads low
    assert sparkline([1.0, 1.0], lo=0.0, hi=1.0) == BLOCKS[-1] * 2
    assert sparkline([0.2, 0.2]) == BLOCKS[0] * 2  # no range: lowest block, not a division by zero
    assert sparkline([0.0, None, 1.0]) == BLOCKS[0] + " " + BLOCKS[-1]
    assert sparkline([0.0] * 50 + [1.0] * 50, width=10) == BLOCKS[0] * 5 + BLOCKS[-1] * 5
    assert sparkline([]) == ""


def test_top_tags_with_fractions():
    assert top_tags({"a": 0.25, "b": 0.5, "c": 0.125, "d": 0.125}) == "b 0.50, a 0.25, c 0.12, +1 more"
    assert top_tags({}) == "no tags" and top_tags(None) == "no tags"


def test_interface_versions_and_guidelines_that_turned_on():
    assert guidelines_turned_on(rows()) == [("active_respond", 2), ("state_aware", 3)]
    assert interface_text(rows(), 0) == "v0 -> v2; guidelines turned on: active_respond (step 2), state_aware (step 3)"
    assert interface_text(rows()[:1], 0) == "v0 throughout; guidelines turned on: none"
    # A first round that already evolved the interface still counts from the version the run began with.
    assert interface_text(rows()[1:2], 0) == "v0 -> v1; guidelines turned on: active_respond (step 2)"


def test_result_line_is_one_line_for_scripts():
    assert result_line(rows(), "runs/x", 412.0) == (
        "done: 3 steps in 6 min 52 s; reward 0.00 -> 1.00; policy v2, interface v2; run dir runs/x"
    )
    assert result_line(rows(), "runs/x", 60.0, steps_now=1).startswith("done: 3 steps (1 this time) in 1 min 00 s;")


def test_summary_has_every_part_a_person_looks_for():
    text = summary_text(rows(), "runs/my run", 412.0, SNAPSHOTS, checkpoint=True, curves=True)
    lines = text.splitlines()
    assert lines[0] == result_line(rows(), "runs/my run", 412.0)
    assert lines[1] == "reward by step   " + BLOCKS[0] + BLOCKS[4] + BLOCKS[-1] + "  0.00 -> 1.00 (range 0.00 to 1.00)"
    assert lines[2] == "by category      no category in both halves of the run"  # rows() carry no categories
    assert lines[3] == "failure profile  step 1: empty_turn_model_response 0.75, state_mismatch 0.25"
    assert lines[4] == "                 step 3: pass 1.00"
    assert lines[5] == "interface        v0 -> v2; guidelines turned on: active_respond (step 2), state_aware (step 3)"
    assert lines[6] == "policy           v0 -> v2; 1 of 3 steps skipped, 3 groups filtered (equal rewards) by the steps"
    # (4 x 100 + 8 x 100 + 6 x 200) / 400 generated tokens per second; learner rate over trained steps only.
    assert lines[7] == "throughput       6.0 generated tokens/s, 0.60 learner samples/s"
    assert lines[8] == (
        "TensorBoard      .venv/bin/tensorboard --logdir 'runs/my run/tensorboard', "
        "then http://localhost:6006/#custom_scalars"
    )
    assert lines[9] == "snapshots        'runs/my run/snapshots' (A_0, A_1)"
    assert lines[10] == "checkpoint       'runs/my run/checkpoints/latest'"
    assert lines[11] == "metrics          'runs/my run/metrics.jsonl', curves 'runs/my run/training_curves.png'"
    assert lines[12] == "evaluate         .venv/bin/seal evaluate 'runs/my run' && .venv/bin/seal report 'runs/my run'"
    assert len(lines) == 13
    # Without snapshots: a first step that trained started from the version before its update.
    assert "\npolicy           v0 -> v2; 0 of 2 steps skipped" in summary_text(
        rows()[1:], "r", 1.0, [], checkpoint=True, curves=True
    )
    one = summary_text(rows()[:1], "r", 10.0, SNAPSHOTS[:1], checkpoint=False, curves=False).splitlines()
    assert (
        "step 1:" in one[2] and one[3].startswith("interface") and "no learner update" in one[5]
    )  # one step: no halves
    assert "none (trainer.checkpoint_every=0)" in one[8] and one[9] == "metrics          r/metrics.jsonl"
    with pytest.raises(ValueError, match="at least one learner step"):
        summary_text([], "r", 1.0, [], checkpoint=True, curves=True)


def test_category_halves_compare_each_category_with_itself():
    """The step means mix categories (0.10, 0.80, 0.10, 0.90 here: no trend); each category's own
    first-half and second-half rewards, pooled over its rollouts, show both rising."""
    steps = [
        ({"base": 0.0, "miss_param": 0.5}, {"base": 6, "miss_param": 2}),
        ({"miss_param": 0.8}, {"miss_param": 6}),
        ({"base": 0.1}, {"base": 6}),
        ({"base": 0.5, "miss_param": 1.0}, {"base": 2, "miss_param": 6}),
        ({"recovery": 0.0}, {"recovery": 6}),
    ]  # only in the second half: left out
    rows = [{"reward_by_category": r, "rollouts_by_category": n} for r, n in steps]
    halves = category_halves(rows)  # first half: steps 1-2; second: steps 3-5
    assert halves["base"] == (0.0, pytest.approx((0.1 * 6 + 0.5 * 2) / 8))
    assert halves["miss_param"] == (pytest.approx((0.5 * 2 + 0.8 * 6) / 8), 1.0)
    assert set(halves) == {"base", "miss_param"}
    assert category_text(halves) == (
        "base 0.00 -> 0.20, miss_param 0.73 -> 1.00 (first half -> second half of the steps; mean change +0.24)"
    )
    # Rows written before rollouts_by_category existed: each step counts once.
    assert category_halves([{"reward_by_category": {"base": 0.0}}, {"reward_by_category": {"base": 1.0}}]) == {
        "base": (0.0, 1.0)
    }
    assert category_halves(rows[:1]) == {} and category_text({}) == "no category in both halves of the run"


def test_training_curves_png(tmp_path):
    from seal.run.plot import plot_training

    path = plot_training(rows(), tmp_path / "curves" / "training_curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
    with pytest.raises(ValueError, match="no learner steps"):
        plot_training([], tmp_path / "x.png")


def _final(held_in_change_ci, held_out_ci=(-0.05, 0.05)):
    side = lambda k, n: {"successes": k, "n": n, "rate": k / n, "ci95": [0.1, 0.6]}
    row = lambda name, out, ci: {
        "name": name,
        "held_out": out,
        "before": side(10, 40),
        "after": side(20, 40),
        "change": {"value": 0.25, "gained": 12, "lost": 2, "ci95": list(ci)},
    }
    return {
        "before": "A_0",
        "after": "A_1",
        "tasks": 120,
        "held_out": ["recovery"],
        "settings": {"max_new_tokens": 48},
        "rows": [
            row("base", False, (0.0, 0.4)),
            row("miss_param", False, (0.0, 0.4)),
            row("recovery", True, held_out_ci),
            row("held-in (all)", False, held_in_change_ci),
        ],
    }


def test_the_closing_note_shows_the_frozen_evaluation_beside_the_training_figures():
    from seal.run.summary import summary_text

    text = summary_text(rows(), "runs/x", 130.0, SNAPSHOTS, checkpoint=True, curves=True, final=_final((0.1, 0.4)))
    lines = text.splitlines()
    assert "held-in test success 0.25 -> 0.50 (A_0 -> A_1, raw interface)" in lines[0]
    frozen = [line for line in lines if line.startswith("frozen eval")]
    assert frozen and "A_0 -> A_1 on the same 120 test tasks, raw interface, greedy, 48 new tokens/step" in frozen[0]
    assert any("base" in line and " 10/40  " in line and "change +25 pts [+0, +40]" in line for line in lines)
    assert any("recovery (held out)" in line for line in lines)
    assert lines[[i for i, x in enumerate(lines) if x.startswith("frozen eval")][0] + 5].strip() == (
        "on unseen test tasks, A_1 vs A_0: held-in (all): better; recovery (held-out category): "
        "no change the 95% interval can tell from zero"
    )


def test_the_verdict_says_worse_when_the_whole_interval_is_below_zero():
    from seal.run.summary import verdict

    assert "held-in (all): worse" in verdict(_final((-0.3, -0.01)))
    assert "held-in (all): no change" in verdict(_final((-0.3, 0.01)))


def test_the_note_says_how_many_episodes_the_system_ended_and_where_the_tokens_went():
    from seal.run.summary import infra_text, tokens_text

    books = {
        "trained": 600,
        "stale_dropped": 0,
        "filtered": 200,
        "update_aborted": 0,
        "infra_failed": 150,
        "lost": 0,
        "in_flight_end": 50,
        "attributed": 1000,
        "generated": 1000,
        "unattributed": 0,
    }
    steps = [
        {"infra_failures": {"generation_error": 2, "env_error": 0}, "episodes_played": 8, "fault_reissued_groups": 1},
        {"infra_failures": {"env_error": 1}, "episodes_played": 12, "given_up": 1, "tokens_run": books},
    ]
    assert infra_text(steps) == (
        "3 of 20 episodes (15.0%) ended by the system, not scored (generation_error 2, env_error 1); "
        "1 groups re-issued, 1 tasks given up"
    )
    assert tokens_text(steps) == (
        "60% of generated tokens reached a gradient (trained 600, filtered (equal rewards) 200, infra-failed 150, "
        "in flight at the end 50); the engine generated 1000, 0 unattributed"
    )
    crashed = {**books, "in_flight_end": 30, "attributed": 980, "unattributed": 20}
    assert tokens_text([{"lost_groups": {"RayActorError": 1}, "tokens_run": crashed}]).endswith(
        "the engine generated 1000, 20 unattributed (left with crashed actors or replicas)"
    )
    assert tokens_text([{"lost_groups": {}, "tokens_run": crashed}]).endswith(
        "20 unattributed (no crash or deadline explains it: the books have a gap)"
    )
    assert infra_text([{"episodes_played": 4}]) == "none of 4 episodes ended by the system"
    assert tokens_text([{}]) == "not counted (a run from before the token ledger)"
    text = summary_text([{**r, **s} for r, s in zip(rows()[1:], steps)], "r", 1.0, [], checkpoint=True, curves=True)
    assert f"\ninfra faults     {infra_text(steps)}\ntokens           {tokens_text(steps)}\nthroughput" in text


def test_the_note_lists_held_in_success_at_every_snapshot_when_there_are_more_than_two():
    from seal.run.summary import final_lines

    final = _final((0.1, 0.4))
    point = lambda name, step, rate: {"name": name, "step": step, "rows": {"held-in (all)": {"rate": rate}}}
    final["curve"] = [point("A_0", 0, 0.25), point("A_1", 5, 0.4)]
    assert not any("at every snapshot" in line for line in final_lines(final))  # two snapshots: the rows say it all
    final["curve"].append(point("A_2", 10, 0.5))
    assert (
        final_lines(final)[-1].strip()
        == "held-in (all) at every snapshot: A_0 (step 0) 25%, A_1 (step 5) 40%, A_2 (step 10) 50%"
    )
