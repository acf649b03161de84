"""The KL reference from the generator on the playing side (rollout/play.py, trainer.reference_logprobs=
generator): once a group is played its generator scores the trajectories on the base model in one call,
and each record carries the scores aligned with its tokens, 0.0 where the policy generated nothing. What
the generator cannot score whole is left to the learner; a replica that fails takes the group with it.
The replica's side (vLLM, no adapter): tests/integration/test_lora_async_generation.py."""

from __future__ import annotations

import pytest

from env_pool.toy.env import ToyToolEnv
from rollout.generator import GeneratorUnavailable, SamplingConfig
from rollout.play import GroupStats, run_group
from tests.unit.rollout.test_play import ScriptedGenerator, chat, toy_reference  # noqa: F401  (chat: a fixture)


def base_logprob(token: int) -> float:
    """The scripted base model: a log-prob that depends on the token, so a shifted alignment shows."""
    return -0.01 * (token % 97) - 0.001


class ScoringGenerator(ScriptedGenerator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scored: list[list[list[int]]] = []  # one entry per call: the sequences asked
        self.reference_fail: Exception | None = None
        self.short_by = 0  # answer this many log-probs too few

    def reference_logprobs(self, sequences):
        self.scored.append([list(s) for s in sequences])
        if self.reference_fail is not None:
            raise self.reference_fail
        return [[base_logprob(t) for t in s[1 : len(s) - self.short_by]] for s in sequences]


def play(generator, chat, n=2, **kwargs):
    stats = GroupStats()
    trajs = run_group(
        ToyToolEnv, generator, chat, "toy_4", n, SamplingConfig(max_new_tokens=64), group_id="g", stats=stats, **kwargs
    )
    return trajs, stats


def test_each_trajectory_carries_the_base_log_prob_of_its_generated_tokens(chat):
    generator = ScoringGenerator(chat, {0: [toy_reference("toy_4")], 1: ["I do not know."]})
    trajs, stats = play(generator, chat, reference=True)
    assert len(generator.scored) == 1  # the whole group in one call
    assert generator.scored[0] == [t.token_ids for t in trajs]
    for t in trajs:
        t.validate()
        assert t.reference_logprobs is not None and len(t.reference_logprobs) == len(t.token_ids)
        want = [base_logprob(tok) if m else 0.0 for tok, m in zip(t.token_ids, t.loss_mask)]
        assert t.reference_logprobs == [0.0] + want[1:]
        assert any(t.reference_logprobs)
    assert stats.reference_tokens == sum(len(t.token_ids) for t in trajs) and stats.reference_s >= 0.0


def test_without_it_nothing_is_asked_and_nothing_carried(chat):
    generator = ScoringGenerator(chat, {0: [toy_reference("toy_4")], 1: ["I do not know."]})
    trajs, stats = play(generator, chat)
    assert generator.scored == [] and all(t.reference_logprobs is None for t in trajs)
    assert stats.reference_tokens == 0


def test_a_trajectory_as_long_as_the_context_is_left_to_the_learner(chat):
    generator = ScoringGenerator(chat, {0: [toy_reference("toy_4")], 1: ["I do not know."]})
    trajs, _ = play(generator, chat, n=2)
    longest = max(len(t.token_ids) for t in trajs)
    generator = ScoringGenerator(chat, {0: [toy_reference("toy_4")], 1: ["I do not know."]})
    generator.max_model_len = longest  # the longest one fills it: no room for the scoring request's token
    trajs, _ = play(generator, chat, reference=True)
    carried = [t.reference_logprobs is not None for t in trajs]
    assert carried == [len(t.token_ids) < longest for t in trajs] and not all(carried)


def test_a_failed_replica_takes_the_group_and_its_tokens_are_counted_lost(chat):
    generator = ScoringGenerator(chat, {0: [toy_reference("toy_4")]})
    generator.reference_fail = GeneratorUnavailable("replica gone")
    stats = GroupStats()
    with pytest.raises(GeneratorUnavailable):
        run_group(
            ToyToolEnv, generator, chat, "toy_4", 1, SamplingConfig(max_new_tokens=64), stats=stats, reference=True
        )
    assert stats.generated_tokens > 0  # what the group generated, for the token books


def test_an_answer_of_the_wrong_length_is_refused(chat):
    generator = ScoringGenerator(chat, {0: [toy_reference("toy_4")]})
    generator.short_by = 1
    with pytest.raises(ValueError, match="reference log-probs for the"):
        play(generator, chat, n=1, reference=True)


def test_an_engine_without_a_base_apart_refuses_by_name(chat):
    generator = ScriptedGenerator(chat, {0: [toy_reference("toy_4")]})
    with pytest.raises(NotImplementedError, match="ScriptedGenerator serves no base model"):
        play(generator, chat, n=1, reference=True)
