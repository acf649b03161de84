"""The text of `seal train`'s progress lines (seal/run/progress.py): pure functions."""

from __future__ import annotations

import io
import re
import time

from replay.control_messages import GroupJob, GroupReport, GroupStats
from seal.run.progress import (
    GROUP_LINES_MAX,
    Progress,
    clock,
    duration,
    eta_s,
    group_done_text,
    groups_batch_text,
    guideline_change,
    learner_work,
    line,
    rewards_text,
    step_text,
)

LINE = re.compile(r"\[\d+:\d\d:\d\d\] \S+ +\S.*")


def report(rewards=(0.0, 1.0), wall_s=40.0, tokens=200, **kw) -> GroupReport:
    fields = dict(
        slot=3,
        group_id="g0000003a0",
        task_id="add_1",
        actor="env-1",
        sent=len(rewards),
        interface_version=1,
        start_version=2,
        generation=GroupStats(prompt_tokens=100, cached_prompt_tokens=50, generated_tokens=tokens, generate_s=30.0),
        env_s=0.1,
        send_s=0.01,
        wall_s=wall_s,
        env_steps=4,
        tool_calls=1,
        rewards=tuple(rewards),
    )
    return GroupReport(**{**fields, **kw})


def row(step=1, **kw):
    base = {
        "step": step,
        "reward_mean": 0.25,
        "loss": 0.0123,
        "kl": 0.0004,
        "grad_norm": 0.4123,
        "policy_version": step,
        "interface_version": 0,
        "active_guidelines": [],
        "gen_tokens_per_s": 5.25,
        "step_s": 500.0,
        "skipped": False,
    }
    return {**base, **kw}


def test_clock_and_duration_read_at_a_glance():
    assert clock(0) == "0:00:00" and clock(65.9) == "0:01:05" and clock(3 * 3600 + 7) == "3:00:07"
    assert duration(0.42) == "0.4 s" and duration(41.4) == "41 s" and duration(185) == "3 min 05 s"
    assert duration(3720) == "1 h 02 min"


def test_every_line_has_the_same_columns():
    a, b = line(3, "ray", "Ray up in 2.9 s"), line(4000, "learner", "step 1/2: train")
    assert LINE.fullmatch(a) and LINE.fullmatch(b)
    assert a.index("Ray up") == b.index("step 1/2")  # the kind is padded: messages start in one column


def test_rewards_are_short_and_long_groups_are_cut():
    assert rewards_text([0.0, 1.0, 0.5, 1 / 3]) == "rewards 0 1 0.5 0.33 (mean 0.46)"
    assert rewards_text([1.0] * 10).startswith("rewards 1 1 1 1 1 1 1 1 ... (mean 1.00)")
    assert rewards_text([]) == "rewards unknown"


def test_eta_leaves_out_the_first_step_once_there_are_others():
    assert eta_s([], 3) is None
    assert eta_s([100.0], 2) == 200.0
    assert eta_s([300.0, 60.0, 80.0], 2) == 140.0  # the first step filled the pipeline
    assert eta_s([300.0], 0) == 0.0


def test_learner_work_names_the_old_logprob_pass_only_when_it_happens():
    assert learner_work(1, 4, 1, "recompute") == "train on 1 group (4 trajectories)"
    assert (
        learner_work(4, 16, 2, "recompute")
        == "old-logprob pass, then train on 4 groups (16 trajectories, 2 mini-batches)"
    )
    assert learner_work(4, 16, 2, "behaviour") == "train on 4 groups (16 trajectories, 2 mini-batches)"


def test_guideline_changes():
    assert guideline_change(None, ["format"]) == ""
    assert guideline_change([], ["active_respond"]) == "+active_respond"
    assert guideline_change(["format", "state_aware"], ["state_aware", "active_respond"]) == "+active_respond -format"


def test_group_done_line_has_rewards_tokens_rate_and_versions():
    text = group_done_text(report(), filtered=False)
    assert text == (
        "g0000003a0 done on env-1 in 40 s: rewards 0 1 (mean 0.50), 200 tokens (5.0 tok/s), policy v2, interface v1"
    )
    assert group_done_text(report(rewards=(0.0, 0.0)), filtered=True).startswith(
        "g0000003a0 done on env-1 in 40 s: rewards 0 0 (mean 0.00); equal rewards: filtered, 200 tokens"
    )
    assert (
        groups_batch_text(16, [1.0, 0.0], 800, 100.0, 4)
        == "16 groups done (mean reward 0.50), 800 tokens (8.0 tok/s), 4 in flight"
    )


def test_group_line_shows_a_faulted_episode_as_not_scored_and_means_the_scored_ones():
    """Issue 46 item 12: the faulted episode's 0 is not the policy's, and the learner trains on the five."""
    faults = ("", "generation_error", "", "", "", "")
    text = group_done_text(report(rewards=(0.0, 0.0, 1.0, 1.0, 1.0, 1.0), faults=faults), filtered=False)
    assert text.startswith(
        "g0000003a0 done on env-1 in 40 s: rewards 0 - 1 1 1 1 (mean 0.80); "
        "1 of 6 episodes ended by an infra fault (generation_error): not scored, 200 tokens"
    )
    every = report(rewards=(0.0, 0.0), faults=("deadline", "env_error"))
    assert "rewards - - (none scored); 2 of 2 episodes ended" in group_done_text(every, filtered=False)
    out = io.StringIO()
    p = Progress(stream=out)
    p.run_started(target=1, groups_per_step=GROUP_LINES_MAX + 1)
    for _ in range(GROUP_LINES_MAX + 1):  # a line per batch of groups: its mean over the scored episodes
        p.group_done(report(rewards=(0.0, 1.0, 1.0), faults=("env_error", "", "")), filtered=False, in_flight=0)
    assert "groups done (mean reward 1.00)" in out.getvalue()


def test_step_line_trained_and_skipped():
    text = step_text(row(interface_version=1, active_guidelines=["active_respond"]), 3, [], 41.0, eta=140.0)
    assert text == (
        "1/3: reward 0.25, loss 0.012, kl 0.000, grad norm 0.41; policy v1, interface v1 (+active_respond); "
        "5.2 generated tok/s; step 41 s; about 2 min 20 s left"
    )
    skipped = step_text(
        row(step=3, skipped=True, loss=None, kl=None, grad_norm=None, filtered_groups=2), 3, [], 41.0, eta=0.0
    )
    assert skipped == (
        "3/3 skipped (2 groups with equal rewards, no update): reward 0.25; policy v3, interface v0; "
        "5.2 generated tok/s; step 41 s; done"
    )
    assert step_text(row(), 3, None, 41.0, eta=None).endswith("step 41 s")  # no estimate before a step has ended
    held = step_text(row(nonfinite_grad_steps=1), 3, None, 41.0, eta=None)  # learner/optimizer.py held it
    assert "grad norm 0.41, 1 update not applied (gradient norm not finite); policy v1" in held


def test_progress_prints_one_line_per_event_and_nothing_when_quiet():
    out = io.StringIO()
    p = Progress(stream=out)
    p.run_started(target=2, groups_per_step=1, guidelines=[])
    with p.timed("engine", "starting the generator", "generator ready"):
        pass
    p.group_started(GroupJob(slot=0, task_id="add_1", group_id="g0000000a0", n=2, seed=1), "env-0", 0)
    p.group_done(report(), filtered=False, in_flight=0)
    p.learner_train(1, learner_work(1, 2, 1, "recompute"))
    p.step_done(row(interface_version=1, active_guidelines=["active_respond"]))
    p.step_done(row(step=2, active_guidelines=["active_respond"], interface_version=1))
    lines = out.getvalue().splitlines()
    assert len(lines) == 7 and all(LINE.fullmatch(x) for x in lines), lines
    kinds = [x.split()[1] for x in lines]
    assert kinds == ["engine", "engine", "group", "group", "learner", "step", "step"]
    assert lines[1].endswith("generator ready in 0.0 s") and "started on env-0: task add_1" in lines[2]
    assert (
        "(+active_respond)" in lines[5] and "about" in lines[5] and "(+" not in lines[6] and lines[6].endswith("; done")
    )

    quiet = io.StringIO()
    q = Progress(quiet=True, stream=quiet)
    q.run_started(target=1, groups_per_step=1)
    q.emit("ray", "Ray up")
    q.step_done(row())
    assert quiet.getvalue() == ""


def test_many_groups_per_step_print_a_line_per_batch_not_per_group():
    out = io.StringIO()
    p = Progress(stream=out)
    p.run_started(target=1, groups_per_step=16)
    for i in range(32):
        p.group_started(GroupJob(slot=i, task_id="t", group_id=f"g{i}", n=2, seed=i), "env-0", 0)
        p.group_done(report(group_id=f"g{i}"), filtered=False, in_flight=3)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(" groups " in x and "16 groups done (mean reward 0.50)" in x for x in lines)


def test_a_dropped_group_is_said_even_when_group_lines_are_off():
    out = io.StringIO()
    p = Progress(stream=out)
    p.run_started(target=2, groups_per_step=64, guidelines=[])  # too many groups for a line each
    p.group_dropped("g0000006a0", 6, staleness=2, max_staleness=1)
    [said] = out.getvalue().splitlines()
    assert LINE.fullmatch(said) and said.split()[1] == "group"
    assert "g0000006a0 dropped (slot 6): staleness 2 past trainer.max_staleness 1" in said


def test_a_timed_wait_says_it_is_still_waiting_every_heartbeat():
    out = io.StringIO()
    p = Progress(stream=out, heartbeat_s=0.05)
    with p.timed("engine", "starting the generator", "generator ready"):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    still = [x for x in lines if "still starting the generator:" in x and x.endswith("so far")]
    assert lines[0].endswith("starting the generator") and lines[-1].split()[-4:-2] == ["ready", "in"]
    assert len(still) >= 2 and all(LINE.fullmatch(x) for x in lines), lines
    time.sleep(0.15)
    assert out.getvalue().splitlines() == lines  # the beat stops with the wait
