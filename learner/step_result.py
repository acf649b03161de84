"""What one learner step reports, typed: a rank's ``train_shard`` answer through Ray, the ranks'
answers merged (``merge_results``) for the driver, and its part of the step's metrics row
(``learner_row``, read by seal/run/step_metrics.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class LearnerStepResult:
    """One learner step (learner.engine.Learner.train_batch). Loss terms are averaged over the
    step's mini-batches and normalised by the global mini-batch, so the ranks' add up to the
    step's; the statistics are learner/step_stats.py's."""

    step: int  # optimizer steps taken so far
    seconds: float
    learner_world_size: int
    samples_per_s: float
    tokens_per_s: float  # scored tokens
    sequence_tokens: int  # every token of the step's trajectories
    forward_tokens: int  # tokens the forwards ran (a packed group's prompt once)
    scored_tokens: int  # tokens the loss took
    groups: int
    zero_variance_groups: int
    mini_batches: int
    mean_scale: float  # A-Patch's mean trajectory scale
    reward_mean: float
    loss: float
    pg_loss: float
    clip_frac: float
    clip_frac_low: float
    clip_frac_high: float
    clip_frac_dual: float
    ratio_mean: float
    grad_norm: float
    mismatch_tokens: int
    mismatch_kl: float | None  # None: no token generated at the learner's own version
    mismatch_kl_max: float | None
    mismatch_abs_logprob_diff: float | None
    offpolicy_kl: float | None
    is_weight_mean: float
    is_weight_max: float
    is_truncated_frac: float
    ess: float
    kl: float | None = None  # None: no KL term (kl_coef 0)
    entropy: float | None = None  # None: entropy not computed
    tag_weights: Mapping[str, float] = field(default_factory=dict)  # the A-Patch weights the step used
    # Mini-batches whose gradient norm was not finite: their update was not applied (learner/optimizer.py);
    # grad_norm is the mean over the others. The same on every rank (the norm is the group's).
    nonfinite_grad_steps: int = 0
    # Scored tokens whose KL reference came with the trajectory (trainer.reference_logprobs=generator),
    # not from the learner's reference forward.
    reference_carried_tokens: int = 0


# Loss terms come normalised by the global mini-batch: the ranks' values add up to the step's.
_SUMMED = (
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "clip_frac",
    "clip_frac_low",
    "clip_frac_high",
    "clip_frac_dual",
    "ratio_mean",
)
_COUNTS = (
    "sequence_tokens",
    "forward_tokens",
    "scored_tokens",
    "groups",
    "zero_variance_groups",
    "mismatch_tokens",
    "reference_carried_tokens",
)


def merge_results(results: Sequence[LearnerStepResult]) -> LearnerStepResult:
    """One step from every rank's: loss terms and counts summed; the rest (grad norm, the same on
    every rank; off-policy statistics) from rank 0; throughput over the slowest rank."""
    first = results[0]
    if len(results) == 1:
        return first
    summed: dict[str, Any] = {}
    for key in _COUNTS + _SUMMED:
        values = [getattr(r, key) for r in results]
        summed[key] = None if all(v is None for v in values) else sum(v or 0 for v in values)
    seconds = max(r.seconds for r in results)
    return replace(
        first,
        **summed,
        seconds=seconds,
        samples_per_s=sum(r.samples_per_s * r.seconds for r in results) / seconds,
        tokens_per_s=summed["scored_tokens"] / seconds,
        learner_world_size=len(results),
    )


# The step's metrics row takes these fields under their own names ...
ROW_FIELDS = (
    "mean_scale",
    "zero_variance_groups",
    "loss",
    "kl",
    "grad_norm",
    "pg_loss",
    "entropy",
    "clip_frac",
    "clip_frac_low",
    "clip_frac_high",
    "clip_frac_dual",
    "ratio_mean",
    "mismatch_kl",
    "mismatch_kl_max",
    "mismatch_abs_logprob_diff",
    "mismatch_tokens",
    "offpolicy_kl",
    "is_weight_mean",
    "is_weight_max",
    "is_truncated_frac",
    "ess",
    "mini_batches",
    "nonfinite_grad_steps",
    "reference_carried_tokens",
    "tag_weights",
)
# ... and its throughput under the learner's name (the row holds the generator's too).
ROW_RENAMED = {
    "learner_samples_per_s": "samples_per_s",
    "learner_tokens_per_s": "tokens_per_s",
    "learner_scored_tokens": "scored_tokens",  # beside reference_carried_tokens: the share carried
}


def learner_row(result: LearnerStepResult | None) -> dict[str, Any]:
    """The learner's part of a step's metrics row; None for each key of a skipped step."""
    if result is None:
        return dict.fromkeys([*ROW_FIELDS, *ROW_RENAMED])
    row = {name: _plain(getattr(result, name)) for name in ROW_FIELDS}
    return row | {key: getattr(result, name) for key, name in ROW_RENAMED.items()}


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value
