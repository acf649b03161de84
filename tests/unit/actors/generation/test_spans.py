"""A generator output's spans and a trajectory's segments are one type (replay.messages.Segment)."""

from __future__ import annotations

from dataclasses import replace

from actors.generation.replica_counters import merge_spans
from replay.messages import Segment, Trajectory
from replay.wire import decode, encode
from rollout.generator import GenerationOutput


def trajectory(prompt: int, segments: list[Segment]) -> Trajectory:
    generated = segments[-1].end - prompt
    return Trajectory(
        task_id="toy_1",
        category="base",
        env="toy",
        group_id="g",
        rollout_index=0,
        interface_version=0,
        token_ids=list(range(prompt + generated)),
        loss_mask=[0] * prompt + [1] * generated,
        logprobs=[0.0] * prompt + [-0.5] * generated,
        prompt_length=prompt,
        segments=segments,
        reward=1.0,
        success=True,
        progress=1.0,
        tags=["pass"],
        labels=["pass"],
        error_type=None,
        outcome="completed",
        num_tool_calls=0,
        num_steps=1,
    )


def test_adjacent_spans_of_one_version_merge_and_empty_ones_after_the_first_go():
    spans = [Segment(0, 3, 1), Segment(3, 3, 1), Segment(3, 5, 1), Segment(5, 9, 2), Segment(9, 9, 2)]
    assert merge_spans(spans) == [Segment(0, 5, 1), Segment(5, 9, 2)]
    assert merge_spans([Segment(0, 0, 4)]) == [Segment(0, 0, 4)]  # an empty output keeps its one segment


def test_an_outputs_spans_become_the_trajectorys_segments_and_cross_the_wire():
    out = GenerationOutput("r", [7] * 4, [-0.5] * 4, "stop", 1, 8, 0, spans=(Segment(0, 1, 1), Segment(1, 4, 2)))
    assert GenerationOutput("r", [7] * 4, [-0.5] * 4, "stop", 1, 8, 0).version_spans() == (Segment(0, 4, 1),)
    shifted = [replace(s, start=8 + s.start, end=8 + s.end) for s in out.version_spans()]  # after an 8-token prompt
    t = trajectory(8, shifted)
    t.validate()
    back = decode(encode(t))
    assert back.segments == shifted and back.policy_versions == [1, 2] and back.policy_version == 1
