"""Pinned episodes on a replica (actors/generation/episode_pins.py): which adapters a replica keeps
(the retention rule), which version each episode's requests run on, what a pinned run refuses."""

from __future__ import annotations

import pytest

from actors.generation.episode_pins import EpisodePins, droppable, pinned_episodes_problem

WHO = "generator replica pid 1"


def test_the_oldest_adapter_goes_only_once_no_request_and_no_episode_holds_it():
    loaded = [3, 4, 5]
    # v3: an episode is pinned to it; v4: a request runs on it; v5 the newest: all kept.
    assert droppable(loaded, 5, in_use={4: 1}, pinned={3}) == []
    assert droppable(loaded, 5, in_use={4: 1}, pinned=set()) == [3]  # the episode ended
    assert droppable(loaded, 5, in_use={}, pinned=set()) == [3, 4]
    assert droppable(loaded, 5, in_use={5: 0}, pinned={5}) == [3, 4]  # the newest is never dropped
    assert droppable([], None, {}, set()) == []


def test_an_episode_runs_on_its_first_turns_version_while_new_ones_take_the_newest():
    pins = EpisodePins()
    assert pins.pin("g-0", None, 3, [3], WHO) == 3  # first turn: the newest, and pinned there
    # v4 lands: the pinned episode's next turns stay on v3, a new episode starts on v4.
    assert pins.pin("g-0", 3, 4, [3, 4], WHO) == 3
    assert pins.pin("g-1", None, 4, [3, 4], WHO) == 4
    # A first turn aborted by an update and continued (its output not back yet): still its version.
    assert pins.pin("g-0", None, 4, [3, 4], WHO) == 3
    assert pins.held() == {3, 4} and pins.episodes(3) == 1
    assert pins.end(["g-0", "g-9"]) == 1  # g-9 never pinned here
    assert pins.held() == {4}


def test_a_replica_that_no_longer_serves_the_episodes_version_refuses_the_request():
    pins = EpisodePins()
    with pytest.raises(ValueError, match=r"replica pid 1: episode g-0 is pinned to policy v2, which this replica no"):
        pins.pin("g-0", 2, 4, [4], WHO)  # e.g. restarted since: it holds v4 only
    pins.pin("g-1", None, 4, [4], WHO)
    with pytest.raises(ValueError, match="episode g-1 is pinned to v4 but asks for v3"):
        pins.pin("g-1", 3, 4, [3, 4], WHO)


def test_a_silent_episodes_pin_idles_out_so_a_dead_env_actor_holds_no_adapter():
    now = [0.0]
    pins = EpisodePins(idle_ttl_s=60.0, clock=lambda: now[0])
    pins.pin("g-0", None, 3, [3], WHO)
    now[0] = 59.0
    assert pins.held() == {3}
    now[0] = 61.0
    assert pins.held() == set() and pins.expired == 1


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (("pinned", True, None, None, 2), "needs LoRA adapters (learner.cfg.lora.rank=R): a full-weight publish"),
        (("pinned", True, 8, "merged", 2), "needs learner.cfg.lora.publish=adapter: with publish=merged"),
        (("pinned", False, 8, "adapter", 2), "needs the async generator (generator=vllm_async_cpu or vllm_async_gpu)"),
        (("pinned", True, 8, "adapter", 1), "two adapter slots at least: generator.max_loras=1"),
    ],
)
def test_pinned_is_refused_where_it_cannot_work(settings, says):
    line = pinned_episodes_problem(*settings)
    assert line is not None and line.startswith("trainer.episode_version=pinned") and says in line


def test_pinned_with_adapters_on_the_async_engine_and_latest_anywhere_pass():
    assert pinned_episodes_problem("pinned", True, 8, "adapter", 2) is None
    assert pinned_episodes_problem("latest", False, None, None, 1) is None
