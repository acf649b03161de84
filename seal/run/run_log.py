"""What a training run writes as it goes: metrics.jsonl (one object per learner
step), rounds.jsonl (per-round failure profile and interface state) and
TensorBoard scalars and text. docs/main-job.md's "TensorBoard scalars" list names
every tag written here (tests/integration/test_cli_generation.py reads both)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replay.control_messages import InterfaceStateMessage
from replay.token_ledger import BUCKETS

SCALARS = (
    "reward_mean",
    "policy_version",
    "prefix_cache_hit_rate",
    "env_tool_calls",
    "staleness_mean",
    "staleness_max",
    "mean_scale",
    "interface_version",
    "gen_tokens_per_s",
    "env_steps_per_s",
    "learner_samples_per_s",
    "learner_tokens_per_s",
    "publish_s",
    "dropped",
    "reissued",
    "rejected",
    "unauthorized",
    "abandoned",
    "loss",
    "kl",
    "env_actors",
    "step_s",
    # off-policy control and episodes (learner/step_stats.py, seal/run/step_metrics.py)
    "filtered_groups",
    "filtered_total",
    "trained_groups",
    "trained_reward_mean",
    "mismatch_kl",
    "mismatch_kl_max",
    "mismatch_abs_logprob_diff",
    "offpolicy_kl",
    "is_weight_mean",
    "is_weight_max",
    "is_truncated_frac",
    "ess",
    "clip_frac",
    "clip_frac_low",
    "clip_frac_high",
    "clip_frac_dual",
    "entropy",
    "grad_norm",
    "response_len_mean",
    "response_len_max",
    "response_truncated_frac",
    "tool_calls_per_episode",
    "parse_failures_per_episode",
    "token_staleness_mean",
    "token_staleness_max",
    "mixed_version_episodes",
    "tokens_per_s_per_device",
    # generator replicas' weight updates (seal/run/step_metrics.py replica_metrics)
    "prefix_cache_reset_refused",
    "drain_timeouts",
    "weight_rounds_failed",
    # infra faults: episodes the system ended, never scored (replay/queue.py); slots given up (replay/slots.py)
    "infra_failures_total",
    "episodes_played",
    "fault_reissued_groups",
    "given_up",
    # NaN guards (issue 46): rollouts refused for a non-finite logprob; updates held for a non-finite norm
    "nonfinite_refused",
    "nonfinite_grad_steps",
)
GROUPS = (
    "tag_weights",
    "tag_fractions",
    "success_by_category",
    "reward_by_category",
    "wait_s",
    "idle_ratio",
    "infra_failures",
    "tokens",
)


# Every family of per-key scalars docs/main-job.md lists as FAMILY/<key>: the row's groups, and the
# token buckets drawn stacked (stacked_tokens).
FAMILIES = (*GROUPS, "tokens_stacked")


def stacked_tokens(tokens: Mapping[str, Any]) -> dict[str, int]:
    """The step's token buckets as the lines of a stacked chart (TensorBoard draws lines, not areas):
    line k is the sum of the first k buckets, so the band between two lines is one bucket and the
    top line is every token the step attributed."""
    out, total = {}, 0
    for k, bucket in enumerate(BUCKETS, 1):
        total += int(tokens.get(bucket) or 0)
        out[f"{k}_{'' if k == 1 else '+'}{bucket}"] = total
    return out


# TensorBoard's Custom Scalars tab (http://localhost:6006/#custom_scalars, which the closing note
# names): what a user asks first (is it learning, per category; before vs after on the raw
# interface) above the engine-room charts. Each chart is a regex over the tags written here
# and by seal/run/final_eval.py (eval/<row>/success at A_0's step and the final one).
LAYOUT = {
    "1 outcome": {
        "frozen evaluation: success on test tasks, A_0 -> final (raw interface)": ["Multiline", [r"eval/.*/success"]],
        "training success by category": ["Multiline", [r"success_by_category/.*"]],
        "training reward (all rollouts; trained groups)": [
            "Multiline",
            [r"train/reward_mean", r"train/trained_reward_mean"],
        ],
    },
    "2 learning": {
        "loss, KL, grad norm, entropy": [
            "Multiline",
            [r"train/loss", r"train/kl", r"train/grad_norm", r"train/entropy"],
        ],
        "clipping": ["Multiline", [r"train/clip_frac.*"]],
        "off-policy: staleness and mismatch": [
            "Multiline",
            [r"train/.*staleness.*", r"train/mismatch_kl", r"train/offpolicy_kl"],
        ],
    },
    "3 diagnosis and interface": {
        "failure profile (tag fractions)": ["Multiline", [r"tag_fractions/.*"]],
        "tag weights": ["Multiline", [r"tag_weights/.*"]],
        "interface version": ["Multiline", [r"train/interface_version"]],
    },
    "4 throughput": {
        "generation tokens/s and learner samples/s": [
            "Multiline",
            [r"train/gen_tokens_per_s", r"train/learner_samples_per_s"],
        ],
        "step seconds and waits": ["Multiline", [r"train/step_s", r"wait_s/.*"]],
        "idle ratio per stage": ["Multiline", [r"idle_ratio/.*"]],
    },
    "5 where the generated tokens went": {
        # replay/token_ledger.py: every generated token in one bucket, by the step that decided its group
        "generated tokens by fate, stacked (each line adds a bucket; tokens/generated: the engine's count)": [
            "Multiline",
            [r"tokens_stacked/.*", r"tokens/generated"],
        ],
        "infra failures by kind (episodes the system ended, never scored)": [
            "Multiline",
            [r"infra_failures/.*", r"train/infra_failures_total"],
        ],
    },
}


class RunLog:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self._metrics = open(run_dir / "metrics.jsonl", "a")
        self._rounds = open(run_dir / "rounds.jsonl", "a")
        self._writer = SummaryWriter(str(run_dir / "tensorboard"))
        self._writer.add_custom_scalars(LAYOUT)

    def write(self, row: Mapping[str, Any], interface: InterfaceStateMessage) -> None:
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._rounds.write(
            json.dumps({"step": row["step"], "failure_profile": row["tag_fractions"], "interface": interface.to_dict()})
            + "\n"
        )
        self._rounds.flush()
        step = row["step"]
        for key in SCALARS:
            if row.get(key) is not None:
                self._writer.add_scalar(f"train/{key}", row[key], step)
        for group in GROUPS:
            for k, v in (row.get(group) or {}).items():
                if v is not None:
                    self._writer.add_scalar(f"{group}/{k}", v, step)
        for k, v in stacked_tokens(row.get("tokens") or {}).items():
            self._writer.add_scalar(f"tokens_stacked/{k}", v, step)
        self._writer.add_text("interface/active_guidelines", ", ".join(row["active_guidelines"]) or "none", step)
        self._writer.flush()

    def close(self) -> None:
        self._metrics.close()
        self._rounds.close()
        self._writer.close()
