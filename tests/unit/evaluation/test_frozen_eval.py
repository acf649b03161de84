"""The closing evaluation's task choice and its fixed benchmark prompt (evaluation/frozen.py)."""

import pytest

from env_pool.interface.state import InterfaceState
from env_pool.shopping.env import ShoppingEnv
from evaluation.frozen import final_tasks, opening_prompt, prompt_digest


def test_final_tasks_take_the_test_split_per_category_and_name_the_held_out_ones():
    test = ShoppingEnv().task_ids("test")
    every = final_tasks(test, ["recovery"])
    assert len(every.task_ids) == len(test) == 240 and every.held_out == ("recovery",)
    assert sorted(set(every.categories.values())) == ["base", "miss_param", "recovery"]
    few = final_tasks(test, ["recovery", "not_in_this_env"], per_category=5)
    assert len(few.task_ids) == 15 and few.held_out == ("recovery",)
    assert [c for c in few.categories.values()].count("base") == 5


def test_final_tasks_refuse_an_empty_split():
    with pytest.raises(ValueError, match="empty"):
        final_tasks([], [])


def test_the_benchmark_prompt_is_the_same_for_A0_and_a_trained_snapshot(tmp_path):
    """A_k's directory holds the tokenizer the run saved beside its new weights (seal/run/run_state.py);
    whatever interface version the run reached, evaluation renders the raw one: same tokens."""
    from rollout.chat import ChatTokenizer
    from weights.model_assets import load_tokenizer, prepare_tiny_model

    base = str(prepare_tiny_model())
    snapshot = tmp_path / "A_1" / "weights"
    load_tokenizer(base).save_pretrained(snapshot)
    make_env = ShoppingEnv
    task = ShoppingEnv().task_ids("test")[0]
    a0 = opening_prompt(make_env, ChatTokenizer(load_tokenizer(base)), task)
    from transformers import AutoTokenizer

    ak = opening_prompt(make_env, ChatTokenizer(AutoTokenizer.from_pretrained(str(snapshot))), task)
    assert a0 == ak and prompt_digest(a0) == prompt_digest(ak)
    # The training interface (what the run's actors saw at v2) renders a different, longer prompt.
    trained = ChatTokenizer(load_tokenizer(base)).prompt_ids(
        ShoppingEnv().reset(
            task, InterfaceState(version=2, schema_lite=True, error_feedback=True, worked_examples=True)
        )
    )
    assert trained != a0 and len(trained) > len(a0)


def test_the_raw_prompt_holds_the_benchmark_exchanges():
    from env_pool.interface.state import RAW_INTERFACE

    raw = ShoppingEnv().reset("shop_240", RAW_INTERFACE)
    text = "\n".join(m["content"] for m in raw)
    assert "add_item(item='pear', quantity=2)" in text and "How many yogurt would you like?" in text


def _run(name: str, rewards: dict[str, float]):
    from evaluation.frozen import SnapshotRun

    results = {t: ("base" if i % 2 else "add", r >= 1.0) for i, (t, r) in enumerate(rewards.items())}
    return SnapshotRun(name, results, "digest", 1.0, 10, rewards)


def test_partial_credit_puts_the_mean_reward_beside_success_in_the_record_and_the_note():
    from evaluation.frozen import FinalTasks, final_record
    from seal.run.summary import final_lines

    ids = [f"t{i}" for i in range(6)]
    tasks = FinalTasks(tuple(ids), (), {t: ("base" if i % 2 else "add") for i, t in enumerate(ids)})
    settings = {"max_new_tokens": 16}
    graded = final_record(
        [_run("A_0", dict.fromkeys(ids, 0.5)), _run("final", dict(zip(ids, [1.0, 1.0, 0.5, 0.5, 1.0, 0.5])))],
        {"A_0": 0, "final": 2},
        tasks,
        settings,
    )
    assert graded["reward_mean"] == {"A_0": 0.5, "final": 0.75} and graded["partial_credit"]
    assert final_lines(graded)[-1].strip() == "mean reward 0.50 -> 0.75 (partial credit)"
    binary = final_record(
        [_run("A_0", dict.fromkeys(ids, 0.0)), _run("final", dict(zip(ids, [1.0, 0.0] * 3)))],
        {"A_0": 0, "final": 2},
        tasks,
        settings,
    )
    assert not binary["partial_credit"] and not any("mean reward" in line for line in final_lines(binary))
