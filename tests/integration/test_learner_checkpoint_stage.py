"""A checkpoint records the ZeRO stage DeepSpeed ran, and a resume at another one is refused in one
line (issue 46 item 11): one rank runs zero2 as stage 0 (learner/ds_config.py effective_zero_stage),
and a stage-2 checkpoint of one rank (offload, or any written before stage 0 arrived) failed deep in
DeepSpeed's optimizer load (optimizer=None in its model states)."""

from __future__ import annotations

import json

import pytest

from learner.engine import Learner, LearnerConfig
from tests.integration.test_learner_engine import tiny_path  # noqa: F401 (the fixture)


def learner(tiny_path: str, offload: bool) -> Learner:
    cfg = LearnerConfig(
        backend="deepspeed", zero_stage=2, offload_optimizer=offload, mini_batch_groups=1, dtype="float32"
    )
    return Learner(tiny_path, cfg, group_size=2, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


def written(tiny_path: str, path, offload: bool) -> dict:
    lrn = learner(tiny_path, offload)
    lrn.save_checkpoint(path)
    lrn.close()
    return json.loads((path / "learner.json").read_text())


def forget_the_stage(path) -> None:
    """learner.json as a checkpoint from before it recorded the stage has it."""
    meta = json.loads((path / "learner.json").read_text())
    del meta["effective_zero_stage"]
    (path / "learner.json").write_text(json.dumps(meta))


def test_a_resume_at_another_effective_stage_is_refused_in_one_line(tiny_path, tmp_path):
    stage2, stage0 = tmp_path / "stage2", tmp_path / "stage0"
    assert written(tiny_path, stage2, offload=True)["effective_zero_stage"] == 2  # offload keeps ZeRO-2
    assert written(tiny_path, stage0, offload=False)["effective_zero_stage"] == 0
    plain = learner(tiny_path, offload=False)
    with pytest.raises(ValueError, match=r"ZeRO stage 2 \(configured 2\), this learner runs stage 0") as refused:
        plain.load_checkpoint(stage2)
    assert "\n" not in str(refused.value) and "offload_optimizer=true" in str(refused.value)
    forget_the_stage(stage2)  # an older checkpoint: the stage is read from its files
    with pytest.raises(ValueError, match="running ZeRO stage 2"):
        plain.load_checkpoint(stage2)
    forget_the_stage(stage0)
    assert plain.load_checkpoint(stage0) == {} and plain.step == 0  # the same stage resumes, as before
    plain.close()
    offloaded = learner(tiny_path, offload=True)
    with pytest.raises(ValueError, match=r"ZeRO stage 0 \(configured 2\), this learner runs stage 2"):
        offloaded.load_checkpoint(stage0)
    offloaded.close()
