"""Every tag of both vocabularies, each from a crafted trajectory (real bfcl-eval)."""

from __future__ import annotations

import dataclasses

import pytest

from env_pool import tags as T
from env_pool.base import play_scripted
from env_pool.bfcl import judge as judge_module
from env_pool.bfcl.env import BfclEnv
from env_pool.bfcl.judge import judge
from env_pool.bfcl.replay import ground_truth_calls
from env_pool.bfcl.tasks import get_task
from env_pool.tool_calls import ParsedStep, ToolCall, render_calls

TASK = get_task("multi_turn_miss_func_0")  # fs + twitter; turn 2 expects no call; `sort` withheld until turn 3


def diagnose(turn: int, steps: list[ParsedStep], task=TASK, instance_mismatch: str = "release"):
    turns = [
        [ParsedStep(calls=tuple(ground_truth_calls(task, t)))] if task.ground_truth[t] else []
        for t in range(task.num_turns)
    ]
    turns[turn] = steps
    d = judge(task, turns, instance_mismatch)
    return d.tags[turn], d.labels[turn], d


def calls(*items: tuple[str, dict]) -> list[ParsedStep]:
    return [ParsedStep(calls=tuple(ToolCall(n, a) for n, a in items))]


CD_DOC = ("cd", {"folder": "document"})
CD_TEMP = ("cd", {"folder": "temp"})


@pytest.mark.parametrize(
    "turn, steps, tag, label",
    [
        (
            0,
            calls(
                CD_DOC, ("mkdir", {"dir_name": "temp"}), ("mv", {"source": "final_report.pdf", "destination": "temp"})
            ),
            T.PASS,
            T.PASS,
        ),
        (2, [], T.CORRECT_ABSTENTION, T.PASS),
        (2, calls(("ls", {})), T.SPURIOUS_TOOL_CALL, T.INVALID_TOOL_CALL),
        (0, [], T.EMPTY_TURN, T.MISSING_TOOL_CALL),
        (0, [ParsedStep(error="not valid JSON")], T.EMPTY_TURN, T.INVALID_TOOL_CALL),
        (
            0,
            calls(("post_tweet", {"content": "report moved"})),
            T.STATE_MISMATCH,
            T.STATE_MISMATCH,
        ),  # other class: see below
        (
            0,
            calls(
                CD_DOC, ("mkdir", {"dir_name": "tmp2"}), ("mv", {"source": "final_report.pdf", "destination": "tmp2"})
            ),
            T.STATE_MISMATCH,
            T.ARGUMENT_MISMATCH,
        ),
        (0, calls(CD_DOC, ("mkdir", {"dir_name": "temp"})), T.STATE_MISMATCH, T.STATE_MISMATCH),
        (0, calls(CD_DOC, ("mkdir", {})), T.STATE_MISMATCH, T.ARGUMENT_MISMATCH),
        (0, calls(CD_DOC, ("sort", {"file_name": "final_report.pdf"})), T.STATE_MISMATCH, T.INVALID_TOOL_CALL),
        (
            1,
            calls(CD_TEMP, ("grep", {"file_name": "final_report.pdf", "pattern": "revenue"})),
            T.RESPONSE_MISMATCH,
            T.ARGUMENT_MISMATCH,
        ),
        (1, calls(CD_TEMP, ("cat", {"file_name": "nope.txt"})), T.RESPONSE_MISMATCH, T.RECOVERY_FAILURE),
        (1, calls(CD_TEMP, ("cat", {"file_name": "final_report.pdf"})), T.RESPONSE_MISMATCH, T.RESPONSE_MISMATCH),
    ],
)
def test_crafted_turns_get_their_tag_and_label(turn, steps, tag, label):
    got_tag, got_label, d = diagnose(turn, steps)
    assert (got_tag, got_label) == (tag, label)
    assert d.reward == int(tag in (T.PASS, T.CORRECT_ABSTENTION, T.SPURIOUS_TOOL_CALL))


# Turns that act on another API class than the ground truth (twitter, not the file system).
OTHER_CLASS = [
    (0, calls(("post_tweet", {"content": "report moved"})), T.STATE_MISMATCH, T.ERR_STATE),
    (1, calls(CD_TEMP, ("get_tweet", {"tweet_id": 1})), T.RESPONSE_MISMATCH, T.ERR_RESPONSE),
]


@pytest.mark.parametrize("turn, steps, release_tag, error_type", OTHER_CLASS)
def test_instance_mismatch_rule_changes_the_tag_only(turn, steps, release_tag, error_type):
    # release: the tag never fires; the next failing check names the turn.
    got, _, released = diagnose(turn, steps)
    tag, _, d = diagnose(turn, steps, instance_mismatch="classes")
    assert (got, tag) == (release_tag, T.INSTANCE_MISMATCH)
    assert (d.reward, d.error_type) == (released.reward, released.error_type) == (0, error_type)


@pytest.mark.parametrize("rule, tag", [("release", T.STATE_MISMATCH), ("classes", T.INSTANCE_MISMATCH)])
def test_env_passes_its_instance_mismatch_rule_to_the_judge(rule, tag):
    env = BfclEnv(instance_mismatch=rule)
    turns = env.reference_turns(TASK.id)
    turns[0] = [render_calls([ToolCall("post_tweet", {"content": "report moved"})], "json"), "Done."]
    assert play_scripted(env, TASK.id, turns).tags[0] == tag


def test_unknown_instance_mismatch_rule_is_a_clear_error():
    with pytest.raises(ValueError, match="diagnosis.instance_mismatch must be one of release, classes, got 'scope'"):
        diagnose(0, [], instance_mismatch="scope")


def test_ground_truth_that_fails_to_execute_is_gt_error_and_excluded_from_progress():
    broken = dataclasses.replace(TASK, ground_truth=(("cd(no_such_argument=1)",),) + TASK.ground_truth[1:])
    turns = [[]] + [
        [ParsedStep(calls=tuple(ground_truth_calls(TASK, t)))] if TASK.ground_truth[t] else []
        for t in range(1, TASK.num_turns)
    ]
    d = judge(broken, turns)
    assert d.tags[0] == T.GT_ERROR
    assert T.GT_ERROR in T.EXCLUDED_TAGS


def test_a_raising_checker_is_checker_error_not_a_policy_failure(monkeypatch):
    state_checker, response_checker = judge_module._official_checkers()

    def broken_state_checker(model, truth):
        raise AssertionError("checker bug")

    monkeypatch.setattr(judge_module, "_checkers", (broken_state_checker, response_checker))
    tag, _, d = diagnose(0, calls(CD_DOC))
    assert tag == T.CHECKER_ERROR and d.error_type == T.ERR_CHECKER
    assert all(t == T.CHECKER_ERROR for t, g in zip(d.tags, TASK.ground_truth) if g)
    assert d.progress == 1.0  # only the abstention turn is scorable, and it passed


def test_every_tag_of_both_vocabularies_is_covered_here():
    import inspect

    src = inspect.getsource(inspect.getmodule(test_every_tag_of_both_vocabularies_is_covered_here))
    for tag in (*T.RELEASED_TAGS, *T.PAPER_LABELS):
        assert f"T.{next(k for k, v in vars(T).items() if v == tag and k.isupper())}" in src, tag


def test_progress_counts_passed_turns():
    _, _, d = diagnose(0, [])
    assert d.reward == 0 and d.error_type == T.ERR_EMPTY_TURN
    # Without the directory made in turn 0 every later scored turn fails too;
    # only the abstention turn passes.
    assert d.progress == pytest.approx(1 / 5)
