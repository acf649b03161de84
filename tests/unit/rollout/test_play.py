"""Playing a group (rollout/play.py run_group / run_episodes) against a real environment and the real
chat template, with a scripted generator at the edge: the env's verdict is each record's reward, the
policy's own tokens (and only those) are trained with the logprobs they were sampled with, every
generated span carries the weights that made it, a blocking engine gets each step of the group as one
batch, and a lost generator gives the whole group back."""

from __future__ import annotations

import pytest

from env_pool.toy.env import ToyToolEnv
from rollout.chat import ChatTokenizer
from rollout.generator import GenerationOutput, Generator, GeneratorUnavailable, SamplingConfig
from rollout.play import GroupStats, run_episodes, run_group

LOGPROB = -0.5


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    from weights.model_assets import load_tokenizer

    return ChatTokenizer(load_tokenizer("tiny"))


class ScriptedGenerator(Generator):
    """Rollout i's step k answers ``script[i][k]`` (then a plain reply), each ending with EOS;
    ``versions`` changes the weights' version before the given call."""

    max_model_len = 8192

    def __init__(self, chat: ChatTokenizer, script: dict[int, list[str]], versions: dict[int, int] | None = None):
        self.chat, self.script, self.versions = chat, script, versions or {}
        self.batches: list[list[str]] = []
        self.outputs: dict[int, list[list[int]]] = {}  # rollout index -> token ids of each output
        self.fail: Exception | None = None

    @property
    def tokenizer(self):
        return self.chat.tokenizer

    def generate(self, requests, sampling):
        if self.fail is not None:
            raise self.fail
        self.policy_version = self.versions.get(len(self.batches), self.policy_version)
        self.batches.append([r.request_id for r in requests])
        outputs = []
        for r in requests:
            index, step = (int(x) for x in r.request_id.rsplit("-", 2)[1:])
            texts = self.script[index]
            ids = self.chat.encode(texts[step] if step < len(texts) else "Thanks, that is all.") + [self.chat.eos_id]
            self.outputs.setdefault(index, []).append(ids)
            outputs.append(
                GenerationOutput(
                    r.request_id, ids, [LOGPROB] * len(ids), "stop", self.policy_version, len(r.prompt_ids), 0
                )
            )
        return outputs

    def update_weights(self, version, source):
        raise AssertionError("playing never updates weights")


def toy_reference(task_id: str) -> str:
    return ToyToolEnv().reference_turns(task_id)[0][0]


def test_the_group_is_scored_by_the_env_and_only_the_policys_tokens_train(chat):
    generator = ScriptedGenerator(chat, {0: [toy_reference("toy_4")], 1: ["I do not know."]})
    stats = GroupStats()
    trajs = run_group(
        ToyToolEnv, generator, chat, "toy_4", 2, SamplingConfig(max_new_tokens=64), group_id="g", stats=stats
    )
    assert [t.rollout_index for t in trajs] == [0, 1] and {t.group_id for t in trajs} == {"g"}
    assert [t.reward for t in trajs] == [1.0, 0.0]
    assert trajs[0].tags == ["pass"] and trajs[1].tags == ["empty_turn_model_response"]
    for traj in trajs:
        opening = chat.prompt_ids(ToyToolEnv().reset("toy_4"))
        assert traj.token_ids[: traj.prompt_length] == opening and not any(traj.loss_mask[: traj.prompt_length])
        trained = [tok for tok, m in zip(traj.token_ids, traj.loss_mask) if m]
        assert trained == [tok for out in generator.outputs[traj.rollout_index] for tok in out]
        assert [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m] == [LOGPROB] * len(trained)
        assert sum(s.end - s.start for s in traj.segments) == len(trained) == traj.num_generated_tokens
        assert all(traj.loss_mask[s.start : s.end] == [1] * (s.end - s.start) for s in traj.segments)
    assert stats.generated_tokens == sum(t.num_generated_tokens for t in trajs)


def test_a_blocking_engine_gets_each_step_of_the_group_as_one_batch(chat):
    generator = ScriptedGenerator(chat, {i: [toy_reference("toy_4")] for i in range(3)})
    run_group(ToyToolEnv, generator, chat, "toy_4", 3, SamplingConfig(max_new_tokens=64), group_id="g")
    assert [len(batch) for batch in generator.batches] == [3, 3]  # the call, then the answer: every episode each time


def test_tokens_made_under_new_weights_carry_their_version_and_staleness_counts_from_the_oldest(chat):
    generator = ScriptedGenerator(chat, {0: [toy_reference("toy_4")]}, versions={0: 3, 1: 4})
    (traj,) = run_group(ToyToolEnv, generator, chat, "toy_4", 1, SamplingConfig(max_new_tokens=64))
    assert [s.policy_version for s in traj.segments] == [3, 4]
    assert traj.policy_version == 3


def test_episodes_of_several_tasks_play_together_each_with_its_own_task(chat):
    generator = ScriptedGenerator(chat, {0: [toy_reference("toy_4")], 1: [toy_reference("toy_5")]})
    trajs = run_episodes(ToyToolEnv, generator, chat, ["toy_4", "toy_5"], SamplingConfig(max_new_tokens=64))
    assert [(t.task_id, t.category, t.reward) for t in trajs] == [
        ("toy_4", "multiply", 1.0),
        ("toy_5", "get_weather", 1.0),
    ]


def test_a_lost_generator_gives_the_whole_group_back(chat):
    generator = ScriptedGenerator(chat, {0: ["x"], 1: ["y"]})
    generator.fail = GeneratorUnavailable("replica gone")
    with pytest.raises(GeneratorUnavailable):
        run_group(ToyToolEnv, generator, chat, "toy_4", 2, SamplingConfig(max_new_tokens=64))


class LostAfterFirstCall(ScriptedGenerator):
    def generate(self, requests, sampling):
        if self.batches:  # the replica is gone by the second turn
            self.fail = GeneratorUnavailable("replica gone")
        return super().generate(requests, sampling)


@pytest.mark.parametrize("lockstep", [True, False])
def test_a_lost_group_still_counts_what_it_generated(chat, lockstep):
    # What the generator made before the group was lost is reported (the driver's token books count it lost).
    generator = LostAfterFirstCall(chat, {0: [toy_reference("toy_4")], 1: [toy_reference("toy_4")]})
    stats = GroupStats()
    with pytest.raises(GeneratorUnavailable):
        run_group(
            ToyToolEnv, generator, chat, "toy_4", 2, SamplingConfig(max_new_tokens=64), stats=stats, lockstep=lockstep
        )
    made = [tok for outs in generator.outputs.values() for out in outs for tok in out]
    assert made and stats.generated_tokens == len(made)
