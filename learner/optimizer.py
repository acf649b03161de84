"""The learner's optimizer: torch's AdamW (fused) or SGD, whose step is timed and can be held.

A held step applies nothing: a step whose gradient norm is not finite (a NaN or inf anywhere in
the gradients) would make the weights and the optimizer's moments NaN for good. Who decides, per
backend (the step's statistics count it: learner/step_stats.py):

* torch: ``clip_grad_norm_`` returns the norm; not finite, the learner never calls ``step``.
* DeepSpeed stage 0 (one rank: learner/ds_config.py): the learner measures the norm before
  ``engine.step()`` and holds the step here (``StepBox.hold``); DeepSpeed's fp32 path checks
  nothing (deepspeed/runtime/engine.py ``_take_model_step``), then zeroes the gradients.
* DeepSpeed ZeRO 1-3: the ZeRO optimizer finds the norm invalid, discards the gradients without
  calling this step and reports the norm as inf (deepspeed/runtime/zero/stage_1_and_2.py ``step``,
  zero/stage3.py ``step``: ``is_invalid_grad_norm``), the same on every rank (the norm is global).
"""

from __future__ import annotations

from typing import Any

from learner.phases import NO_PHASES


class StepBox:
    """What the optimizer's step reads, kept apart from the learner: the phase clock and the hold.
    In a box the wrapped step can hold it without holding the learner: a cycle would keep a ZeRO-3
    learner's HfDeepSpeedConfig alive after its last use, and later models would load partitioned."""

    def __init__(self, clock: Any = NO_PHASES) -> None:  # a PhaseClock, or NO_PHASES
        self.clock = clock
        self.hold = False  # the next step applies nothing (its gradient norm is not finite)


def make_optimizer(cfg: Any, params: Any, box: StepBox) -> Any:
    """``cfg``: a LearnerConfig. DeepSpeed's ZeRO optimizer calls the wrapped step too."""
    import torch

    optimizer: torch.optim.Optimizer
    if cfg.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=0.0, weight_decay=cfg.weight_decay)
    else:
        # fused: one kernel over each tensor for the whole update (CPU and CUDA), instead of a dozen
        # elementwise passes over ZeRO's flat partition: a third of the optimizer's time on CPU.
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True)
    step = optimizer.step

    def held_or_timed_step(*args, **kwargs):
        if box.hold:
            return None
        with box.clock.phase("optimizer"):
            return step(*args, **kwargs)

    optimizer.step = held_or_timed_step  # type: ignore[method-assign]  # the step, held or timed
    return optimizer
