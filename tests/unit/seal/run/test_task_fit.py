"""The one rule for prompts that cannot fit the context (seal/run/task_fit.py), as
`seal train`, `seal rollout` and `seal eval` apply it: the tiny model's tokenizer, no engine."""

from __future__ import annotations

import pytest

from env_pool.interface.state import RAW_INTERFACE
from seal.commands.rollout import choose_tasks
from seal.config import compose, instantiate
from seal.errors import CliError
from seal.run.task_fit import chat_tokenizer, fit_tasks, prompt_room, select_tasks


@pytest.fixture(scope="module")
def bfcl():
    cfg = compose(["env=bfcl", "model=tiny", "sampling.max_new_tokens=128"])
    env, interface = instantiate(cfg.env), instantiate(cfg.interface)
    ids = env.task_ids("train")[:4]
    chat = chat_tokenizer(cfg)
    lengths = {t: len(chat.prompt_ids(env.reset(t, interface))) for t in ids}
    return cfg, env, interface, ids, chat, lengths


def test_the_room_is_the_context_less_the_answer():
    cfg = compose(["env=bfcl", "model=tiny", "sampling.max_new_tokens=100", "model.max_model_len=4096"])
    assert prompt_room(cfg) == 3996


def test_a_prompt_of_exactly_the_room_fits(bfcl):
    cfg, env, interface, ids, chat, lengths = bfcl
    room = sorted(lengths.values())[1]  # the two shortest fit, the boundary one included
    fit = fit_tasks(chat, env, interface, ids, room)
    assert fit.keep == [t for t in ids if lengths[t] <= room] and len(fit.keep) == 2
    assert fit.overlong == [(t, lengths[t]) for t in ids if lengths[t] > room]
    assert fit.note("R tokens").startswith("skipped 2 of 4 tasks (") and fit.note("R tokens").endswith(
        "opening prompt longer than R tokens"
    )
    assert fit_tasks(chat, env, interface, ids, max(lengths.values())).note("R") == ""


def test_rollout_skips_overlong_tasks_with_a_count(bfcl):
    cfg, env, interface, ids, chat, lengths = bfcl
    # BFCL with 128 tokens to answer (8192-token context): BFCL's first training tasks include overlong ones.
    over = [t for t in ids if lengths[t] > prompt_room(cfg)]
    assert over, "the check below needs an overlong task among the first four"
    keep, skipped, note = choose_tasks(cfg, env, interface, ids, None)
    assert keep == [t for t in ids if t not in over] and skipped == len(over)
    assert note == (
        f"skipped {len(over)} of 4 tasks ({', '.join(over)}): opening prompt longer than "
        f"{prompt_room(cfg)} tokens (model context 8192 minus sampling.max_new_tokens 128)"
    )
    assert choose_tasks(cfg, env, interface, keep, None) == (keep, 0, "")


def test_named_tasks_are_refused_not_skipped(bfcl):
    cfg, env, interface, ids, chat, lengths = bfcl
    over = next(t for t in ids if lengths[t] > prompt_room(cfg))
    fits = next(t for t in ids if lengths[t] <= prompt_room(cfg))
    with pytest.raises(
        CliError,
        match=rf"^task {over}: its opening prompt is {lengths[over]} tokens, longer than {prompt_room(cfg)} tokens",
    ):
        choose_tasks(cfg, env, interface, [], f"{fits},{over}")
    assert choose_tasks(cfg, env, interface, [], fits) == ([fits], 0, "")
    with pytest.raises(CliError, match="unknown task id multi_turn_nope_1 for env BfclEnv"):
        choose_tasks(cfg, env, interface, [], f"{fits},multi_turn_nope_1")
    with pytest.raises(CliError, match="comma-separated task ids"):
        choose_tasks(cfg, env, interface, [], f"{fits},,")


def test_eval_counts_with_its_own_interface(bfcl):
    cfg, env, interface, ids, chat, lengths = bfcl
    raw = {t: len(chat.prompt_ids(env.reset(t, RAW_INTERFACE))) for t in ids}
    room = prompt_room(cfg)
    _, skipped, _ = choose_tasks(cfg, env, RAW_INTERFACE, ids, None)
    assert skipped == sum(raw[t] > room for t in ids)


def test_nothing_left_is_an_error_naming_the_skip(bfcl):
    cfg, env, interface, ids, chat, lengths = bfcl
    over = [t for t in ids if lengths[t] > prompt_room(cfg)]
    with pytest.raises(CliError, match=rf"^no task left to play: skipped {len(over)} of {len(over)} tasks"):
        choose_tasks(cfg, env, interface, over, None)


def test_train_pool_skips_unless_told_to_keep():
    cfg = compose(["env=bfcl", "model=tiny", "limit=6"])
    keep, skipped = select_tasks(cfg)
    assert len(keep) + skipped == 6 and skipped >= 1
    assert select_tasks(compose(["env=bfcl", "model=tiny", "limit=6", "trainer.skip_overlong=false"])) == (
        select_tasks(
            compose(["env=bfcl", "model=tiny", "limit=6", "sampling.max_new_tokens=1", "model.max_model_len=100000"])
        )[0],
        0,
    )
    with pytest.raises(ValueError, match="no task's opening prompt fits 92 tokens"):
        select_tasks(
            compose(["env=bfcl", "model=tiny", "limit=2", "sampling.max_new_tokens=8", "model.max_model_len=100"])
        )
