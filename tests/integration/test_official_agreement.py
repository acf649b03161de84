"""Our verdict equals bfcl-eval's multi_turn_checker on corrupted trajectories."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from env_pool import tags as T
from env_pool.bfcl.judge import judge
from env_pool.bfcl.official import official_verdict
from env_pool.bfcl.replay import ground_truth_calls
from env_pool.bfcl.runtime import call_signatures
from env_pool.bfcl.tasks import get_task, split_ids
from env_pool.tool_calls import ParsedStep, ToolCall, parse_step

KINDS = (
    "wrong_argument",
    "dropped_call",
    "extra_call",
    "reordered_calls",
    "call_in_abstention_turn",
    "empty_turn",
    "truncated",
    "untouched",
)


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    return value


def corrupt(task, rng: random.Random, kind: str):
    turns = [
        [ParsedStep(calls=tuple(ground_truth_calls(task, t)))] if task.ground_truth[t] else []
        for t in range(task.num_turns)
    ]
    t = rng.choice([u for u in range(task.num_turns) if turns[u]])
    calls = list(turns[t][0].calls)
    if kind == "wrong_argument":
        i = rng.randrange(len(calls))
        if calls[i].arguments:
            key = rng.choice(sorted(calls[i].arguments))
            calls[i] = ToolCall(calls[i].name, {**calls[i].arguments, key: _changed(calls[i].arguments[key])})
    elif kind == "dropped_call":
        calls.pop(rng.randrange(len(calls)))
    elif kind == "extra_call":
        calls.insert(rng.randrange(len(calls) + 1), rng.choice(calls))
    elif kind == "reordered_calls":
        rng.shuffle(calls)
    elif kind == "call_in_abstention_turn":
        empty = [u for u in range(task.num_turns) if not task.ground_truth[u]]
        if empty:
            turns[rng.choice(empty)] = [ParsedStep(calls=(rng.choice(calls),))]
    elif kind == "empty_turn":
        calls = []
    turns[t] = [ParsedStep(calls=tuple(calls))] if calls else []
    if kind == "truncated":
        turns = turns[:t]
    if turns and rng.random() < 0.2:  # steps that do not decode are dropped by both
        turns[0] = [ParsedStep(error="garbled")] + list(turns[0])
    return turns


def _agreement(n: int, seed: int):
    rng = random.Random(seed)
    ids = split_ids("all")
    seen_errors: Counter = Counter()
    disagreements = []
    for i in range(n):
        task = get_task(ids[i % len(ids)] if n >= len(ids) else rng.choice(ids))
        kind = KINDS[i % len(KINDS)]
        turns = corrupt(task, rng, kind)
        ours = judge(task, turns)
        valid, error_type = official_verdict(task, turns)
        seen_errors[error_type] += 1
        if (ours.reward, ours.error_type) != (int(valid), error_type):
            disagreements.append((task.id, kind, ours.reward, ours.error_type, valid, error_type))
    return seen_errors, disagreements


def test_verdict_and_error_type_agree_with_official_checker():
    seen, disagreements = _agreement(1600, seed=0)
    assert not disagreements, disagreements[:5]
    # The corruptions exercise every outcome the official checker reports.
    assert {
        None,
        "multi_turn:empty_turn_model_response",
        "multi_turn:instance_state_mismatch",
        "multi_turn:execution_response_mismatch",
        "multi_turn:force_terminated",
    } <= set(seen)
    assert seen[None] > 100 and sum(seen.values()) - seen[None] > 800


@pytest.mark.slow
def test_agreement_on_every_task_many_times():
    seen, disagreements = _agreement(8 * 800, seed=1)
    assert not disagreements, disagreements[:5]


def test_official_oracle_refuses_names_that_are_not_tools():
    task = get_task("multi_turn_base_0")
    turns = [[ParsedStep(calls=(ToolCall("open", {"file": "/tmp/x"}),))]] + [[] for _ in range(task.num_turns - 1)]
    with pytest.raises(ValueError, match="unknown tool"):
        official_verdict(task, turns)
    assert judge(task, turns).reward == 0  # ours never executes it


def test_strings_reach_bfcl_executor_unaltered():
    """bfcl-eval rewrites `name(` anywhere in a call string; our rendering escapes it."""
    from env_pool.bfcl.official import call_string
    from env_pool.bfcl.runtime import prepare_import

    prepare_import()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    task = get_task("multi_turn_base_0")
    content = "run ls(a=True) then cd(folder='x') \\( done"
    calls = [
        ToolCall("touch", {"file_name": "notes.txt"}),
        ToolCall("echo", {"content": content, "file_name": "notes.txt"}),
        ToolCall("cat", {"file_name": "notes.txt"}),
    ]
    try:
        results, _ = multi_turn_utils.execute_multi_turn_func_call(
            [call_string(c) for c in calls],
            task.initial_config,
            list(task.involved_classes),
            "seal_escape_test",
            task.id,
        )
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith("seal_escape_test")]:
            del vars(multi_turn_utils)[key]
    assert json.loads(results[2])["file_content"] == content


def test_ground_truth_in_its_own_python_style_scores_valid_on_every_task(tmp_path, capsys):
    """`seal env score --format python --official` on each ground truth written
    verbatim (160 calls in 96 tasks pass arguments by position)."""
    import ast

    from seal.commands.cli import main

    path = tmp_path / "gt.jsonl"
    positional = 0
    with path.open("w") as fh:
        for task_id in split_ids("all"):
            truth = get_task(task_id).ground_truth
            positional += sum(bool(ast.parse(c, mode="eval").body.args) for turn in truth for c in turn)
            fh.write(
                json.dumps(
                    {
                        "task_id": task_id,
                        "turns": [(["[" + ", ".join(t) + "]"] if t else []) + ["Done."] for t in truth],
                    }
                )
                + "\n"
            )
    assert positional > 0
    assert main(["env", "score", str(path), "--format", "python", "--json", "--official"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 800
    assert [r["task_id"] for r in rows if (r["reward"], r["official"]["reward"]) != (1, 1)] == []
    by_id = {r["task_id"]: r for r in rows}
    assert T.EMPTY_TURN not in by_id["multi_turn_miss_func_85"]["tags"]  # get_zipcode_based_on_city('San Francisco')


def test_positional_arguments_bind_as_bfcl_executor_binds_them():
    """TravelAPI.purchase_insurance's signature order differs from its schema's
    (booking_id before insurance_cost): the executor's eval binds by signature."""
    from env_pool.bfcl.official import call_string
    from env_pool.bfcl.runtime import prepare_import

    prepare_import()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    task = get_task("multi_turn_base_155")
    setup = list(task.ground_truth[0])
    positional = "purchase_insurance('abc123xyz', 'comprehensive', '3426812', 120.0, 'id15583')"
    (step,) = [parse_step(f"[{positional}]", "python", call_signatures(task.involved_classes))]
    assert step.calls[0].arguments["booking_id"] == "3426812" and step.calls[0].arguments["insurance_cost"] == 120.0
    outcomes = []
    for name, call in (("seal_bind_positional", positional), ("seal_bind_keyword", call_string(step.calls[0]))):
        try:
            results, instances = multi_turn_utils.execute_multi_turn_func_call(
                setup + [call], task.initial_config, list(task.involved_classes), name, task.id
            )
            outcomes.append(
                (
                    json.loads(results[-1])["insurance_status"],
                    instances["TravelAPI"].credit_card_list["id15583"]["balance"],
                )
            )
        finally:
            for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
                del vars(multi_turn_utils)[key]
    assert outcomes[0] == outcomes[1] and outcomes[0][0] is True
