"""Gathering a learner step's loss terms, off-policy and mismatch statistics over its micro-batches.

Loss terms come from ``policy_loss`` per micro-batch, already normalised by the
mini-batch, so they are summed within a mini-batch and averaged over
mini-batches. Mismatch and importance-weight statistics are kept as sums over
tokens and divided once at the end, so every token counts the same whatever
the split.

Mismatch (vLLM's behaviour logprobs mu against the learner's pi_old) is only
meaningful at the same weights: it is taken over the trajectories whose every
segment was generated at the learner's current policy version; the
``offpolicy_kl`` figure takes every trajectory (staleness included).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from learner.batch import Sample
from learner.loss import is_weight_stats, mismatch_stats

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

# The loss terms every step reports (learner/step_result.py's required ones; kl and entropy may be absent).
LOSS_TERMS = ("loss", "pg_loss", "clip_frac", "clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean")


class StepStats:
    def __init__(self, policy_version: int | None) -> None:
        self.policy_version = policy_version
        self._minis: list[dict[str, float]] = []
        self._grad_norms: list[float] = []
        self._nonfinite = 0  # mini-batches whose gradient norm was not finite: no update applied
        self._same = {"count": 0.0, "kl_sum": 0.0, "kl_max": 0.0, "abs_diff_sum": 0.0}
        self._all = dict(self._same)
        self._is = {"count": 0.0, "w_sum": 0.0, "w_sq_sum": 0.0, "w_max": 0.0, "cut": 0.0}

    def start_mini(self) -> None:
        self._minis.append({})

    def grad_norm(self, value: float) -> None:
        """A mini-batch's gradient norm; a non-finite one is counted (its update was held: learner/optimizer.py)."""
        if math.isfinite(value):
            self._grad_norms.append(value)
            return
        self._nonfinite += 1
        log.error("gradient norm %s: this optimizer step is not applied (weights and optimizer state unchanged)", value)

    def _same_version(self, s: Sample) -> bool:
        if self.policy_version is None:
            return True
        return bool(s.policy_versions) and all(v == self.policy_version for v in s.policy_versions)

    def add_micro(
        self,
        loss_metrics: dict[str, float],
        micro: Sequence[Sample],
        behaviour: Tensor,
        learner_old: Tensor,
        mask: Tensor,
        is_w: Tensor | None = None,
        cut: Tensor | None = None,
    ) -> None:
        mini = self._minis[-1]
        for key, value in loss_metrics.items():
            mini[key] = mini.get(key, 0.0) + value
        rows = [i for i, s in enumerate(micro) if self._same_version(s)]
        _merge(self._all, mismatch_stats(behaviour, learner_old, mask))
        if rows:
            _merge(self._same, mismatch_stats(behaviour[rows], learner_old[rows], mask[rows]))
        if is_w is not None:
            _merge(self._is, is_weight_stats(is_w, cut, mask))

    def result(self) -> dict[str, Any]:
        """The step's loss terms and statistics, as ``LearnerStepResult`` (learner/step_result.py) names them."""
        # A rank that ran only padding micro-batches (fewer groups than ranks) adds nothing to the
        # step's summed loss terms: zeros, not missing fields (learner/rank_shards.py pads, step_result.py sums).
        out: dict[str, Any] = dict.fromkeys(LOSS_TERMS, 0.0)
        keys = {k for m in self._minis for k in m}
        for key in sorted(keys):
            out[key] = sum(m.get(key, 0.0) for m in self._minis) / len(self._minis)
        out["grad_norm"] = sum(self._grad_norms) / len(self._grad_norms) if self._grad_norms else 0.0
        out["nonfinite_grad_steps"] = self._nonfinite
        same, every, iw = self._same, self._all, self._is
        out["mismatch_tokens"] = int(same["count"])
        out["mismatch_kl"] = same["kl_sum"] / same["count"] if same["count"] else None
        out["mismatch_kl_max"] = same["kl_max"] if same["count"] else None
        out["mismatch_abs_logprob_diff"] = same["abs_diff_sum"] / same["count"] if same["count"] else None
        out["offpolicy_kl"] = every["kl_sum"] / every["count"] if every["count"] else None
        if iw["count"]:
            out["is_weight_mean"] = iw["w_sum"] / iw["count"]
            out["is_weight_max"] = iw["w_max"]
            out["is_truncated_frac"] = iw["cut"] / iw["count"]
            out["ess"] = iw["w_sum"] ** 2 / (iw["count"] * iw["w_sq_sum"]) if iw["w_sq_sum"] else 0.0
        else:  # old_logprobs=behaviour: the ratio is taken against mu itself, no correction weight
            out.update(is_weight_mean=1.0, is_weight_max=1.0, is_truncated_frac=0.0, ess=1.0)
        return out


def _merge(into: dict[str, float], part: dict[str, float]) -> None:
    for key, value in part.items():
        into[key] = max(into[key], value) if key.endswith("_max") else into[key] + value
