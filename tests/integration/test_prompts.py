"""What the policy sees: the raw prompt is bfcl-eval's; training only adds, never leaks."""

from __future__ import annotations

import copy
import re
from collections import defaultdict

import pytest

from env_pool.bfcl.env import BfclEnv
from env_pool.bfcl.replay import ground_truth_calls
from env_pool.bfcl.tasks import get_task, split_ids
from env_pool.interface.guidelines import TEXT
from env_pool.interface.state import RAW_INTERFACE, InterfaceState

FULL = InterfaceState(
    version=4, schema_lite=True, error_feedback=True, guidelines=True, active_guidelines=tuple(TEXT)[:3]
)


def test_raw_python_prompt_is_byte_identical_to_bfcl_eval():
    from env_pool.bfcl.runtime import prepare_import

    prepare_import()
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING as MORE
    from bfcl_eval.model_handler.utils import system_prompt_pre_processing_chat_model
    from bfcl_eval.utils import load_dataset_entry

    env = BfclEnv(tool_format="python", tool_doc_indent=4)
    checked = 0
    for category in ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"):
        for entry in load_dataset_entry(category):
            theirs = system_prompt_pre_processing_chat_model(
                copy.deepcopy(entry["question"][0]), entry["function"], entry["id"]
            )
            assert env.reset(entry["id"]) == theirs, entry["id"]
            for turn, docs in entry.get("missed_function", {}).items():
                assert env.user_messages(int(turn)) == [{"role": "user", "content": MORE.format(functions=docs)}]
            checked += 1
    assert checked == 800


@pytest.mark.parametrize("fmt", ["json", "python"])
def test_interface_off_is_byte_identical_to_raw(fmt):
    env = BfclEnv(tool_format=fmt)
    off = InterfaceState(version=9, guidelines=False, active_guidelines=("format",))
    for task_id in split_ids("all")[::10]:
        assert env.reset(task_id, off) == env.reset(task_id, RAW_INTERFACE)


def _added_text(raw: str, trained: str) -> str:
    raw_lines = set(raw.splitlines())
    return "\n".join(line for line in trained.splitlines() if line not in raw_lines)


def _values(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _values(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _values(v)
    elif isinstance(value, str) and len(value) >= 3:
        yield value


@pytest.mark.parametrize("fmt", ["json", "python"])
def test_training_interface_never_reveals_the_ground_truth(fmt):
    env = BfclEnv(tool_format=fmt)
    by_toolset = defaultdict(set)
    for task_id in split_ids("all"):
        task = get_task(task_id)
        raw = env.reset(task_id, RAW_INTERFACE)[0]["content"]
        trained = env.reset(task_id, FULL)[0]["content"]
        added = _added_text(raw, trained)
        # Same tools -> same additions, whatever the task's answer is.
        by_toolset[tuple(d["name"] for d in task.tools_at_turn(0))].add(added)
        gt_values = {
            v for t in range(task.num_turns) for c in ground_truth_calls(task, t) for v in _values(c.arguments)
        }
        leaked = [v for v in gt_values if v in added and v not in raw and not re.fullmatch(r"[\w ]{1,12}", v)]
        assert not leaked, (task_id, leaked)
        for t in task.withheld:
            env.reset(task_id, RAW_INTERFACE)
            reveal_raw = env.user_messages(t)[0]["content"]
            env.reset(task_id, FULL)
            reveal_trained = env.user_messages(t)[0]["content"]
            annotatable = any(d["parameters"].get("required") for d in task.withheld[t])
            assert ("[required]" in reveal_trained) == annotatable and (reveal_raw != reveal_trained) == annotatable
            leaked = [
                v
                for v in gt_values
                if v in reveal_trained and v not in reveal_raw and not re.fullmatch(r"[\w ]{1,12}", v)
            ]
            assert not leaked, (task_id, t, leaked)
    assert all(len(additions) == 1 for additions in by_toolset.values())
