"""An honest learning test: GRPO on the built-in tool env with the embedded model.

Real parts end to end, synchronous: vLLM CPU generates groups, the learner
(torch backend, same loss and A-Patch as every backend) updates, the new
weights go into vLLM in place. Measured when written (seed fixed, 2 CPU
cores): held-out mean reward before / after, see the assertion's message.
About 10 minutes on two cores: marked slow. Both run at ``dtype: auto`` (the
config default): bf16 on a CPU with AMX/AVX512-BF16, where the weights go to
vLLM in bf16 and the step's mismatch metrics measure the vLLM-bf16 vs
learner gap; fp32 elsewhere.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow
# miss_param test tasks (of 80) the final snapshot solves beyond A_0's under the default (5 steps of 2
# groups): +11, +13 and +11 on seeds 0, 1 and 2 (docs/main-job-results.md).
MISS_PARAM_MARGIN_TASKS = 6


# First in the file: it starts `seal train` as a subprocess whose learner alone peaks near 11 GB; the toy
# test after it runs vLLM and a learner inside the pytest process, which keeps ~7 GB afterwards, and the
# two together crossed Ray's 95% memory line on a 24 GB machine (OOM-killed learner, 2026-12-04).
def test_the_default_command_learns():
    """README's first command (`seal train`, the CPU default: shopping env, embedded model, seed 0),
    judged as its closing note judges it: A_0 and the final snapshot frozen, on the same test tasks,
    the benchmark's raw interface, greedy (evaluation/frozen.py). docs/main-job-results.md has the
    three-seed measurement this margin comes from."""
    import ctypes
    import gc
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    # Ray's memory monitor counts the whole machine, this pytest process included: hand back what
    # earlier in-process tests freed (glibc keeps freed heap), so the run has its ~14 GB.
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to hand back this way
    run = Path(tempfile.mkdtemp(prefix="seal-learn-")) / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", "train", f"run_dir={run}"],
        capture_output=True,
        text=True,
        timeout=3600,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads((run / "evaluation" / "final.json").read_text())
    rows = {r["name"]: r for r in final["rows"]}
    assert list(rows) == ["base", "miss_param", "recovery", "held-in (all)"] and final["held_out"] == ["recovery"]
    assert final["tasks"] == 240 and all(r["before"]["n"] == 80 for n, r in rows.items() if n != "held-in (all)")
    held_in, asked = rows["held-in (all)"], rows["miss_param"]
    # The benchmark prompt's base rates: measurable and unsaturated in every trained category.
    for name in ("base", "miss_param"):
        assert 0.05 <= rows[name]["before"]["rate"] <= 0.9, rows[name]["before"]
    # What holds under the default on all three measured seeds (docs/main-job-results.md: held-in +9 [+5, +14],
    # +11 [+6, +16], +10 [+5, +15]; one group a step had tipped one seed to -28): the final snapshot asks for
    # a missing quantity on unseen tasks more often than A_0, by a margin its paired interval supports,
    # and the held-in pool is better beyond its interval.
    assert asked["change"]["ci95"][0] > 0, (asked, proc.stdout[-2000:])
    assert asked["after"]["successes"] >= asked["before"]["successes"] + MISS_PARAM_MARGIN_TASKS, asked
    assert held_in["change"]["ci95"][0] > 0, (held_in, proc.stdout[-2000:])
    assert "on unseen test tasks, A_1 vs A_0: held-in (all): " in proc.stdout
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # The co-evolution still acts: tag weights move, the interface evolves, every version is recorded.
    weights = [r["tag_weights"] for r in metrics if r["tag_weights"]]
    assert len(weights) >= 2 and weights[0] != weights[-1]
    assert metrics[-1]["interface_version"] >= 1 and metrics[-1]["active_guidelines"]
    assert all(isinstance(r["policy_version"], int) and isinstance(r["interface_version"], int) for r in metrics)
    assert "recovery" not in {c for r in metrics for c in (r.get("rollouts_by_category") or {})}  # held out of training


def test_mean_reward_rises_on_the_toy_env():
    from actors.generation.vllm_engine import VllmGenerator
    from env_pool.tags import RELEASED_BASE_WEIGHTS
    from env_pool.toy.env import ToyToolEnv
    from learner.engine import Learner, LearnerConfig
    from learner.loss import LossConfig
    from rollout.chat import ChatTokenizer
    from rollout.generator import SamplingConfig
    from rollout.play import run_group
    from weights.model_assets import prepare_embedded_model

    path = str(prepare_embedded_model())
    gen = VllmGenerator(path, max_model_len=4096, cpu_kv_cache_gb=1, dtype="auto")
    chat = ChatTokenizer(gen.tokenizer)
    groups, n, steps = 2, 8, 8
    lrn = Learner(
        path,
        LearnerConfig(
            backend="torch",
            lr=3e-5,
            mini_batch_groups=groups,
            micro_batch_size=4,
            loss=LossConfig(kl_coef=0.001),
            dtype="auto",
        ),
        group_size=n,
        world_size=1,
        timeout_s=600.0,
        step_timeout_s=3600.0,
    )
    env = ToyToolEnv()
    train, held_out = env.task_ids("train"), env.task_ids("test")[:16]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=32)

    def held_out_reward() -> float:
        rewards = [
            t.reward
            for i, task in enumerate(held_out)
            for t in run_group(ToyToolEnv, gen, chat, task, 4, sampling, seed=10_000 + i)
        ]
        return sum(rewards) / len(rewards)

    mismatch = []  # mean |log mu - log pi_old| per step: vLLM vs the learner at the same weights
    before = held_out_reward()
    assert before > 0.05, "the task must be learnable: base success clearly above zero"
    for step in range(steps):
        batch = [
            t
            for g in range(groups)
            for t in run_group(ToyToolEnv, gen, chat, train[step * groups + g], n, sampling, seed=step * 100 + g)
        ]
        out = lrn.train_batch(batch, RELEASED_BASE_WEIGHTS, policy_version=step)
        mismatch.append(out.mismatch_abs_logprob_diff)
        gen.update_weights(step + 1, lrn.weights_out.generator_weights(gen.dtype))
    after = held_out_reward()
    gen.close()
    print(
        f"generator {gen.dtype}, learner {lrn.dtype}: held-out reward {before:.3f} -> {after:.3f}; "
        f"mismatch |d logp| per step {[round(m, 4) for m in mismatch]}"
    )
    # Mean |log mu - log pi_old| measured on the embedded model: fp32 ~1e-5, bf16 vLLM vs the bf16 learner
    # ~0.05 (seal bench precision); a broken weight load (old or wrongly cast weights) is ~1.
    assert all(m is not None and m < 0.25 for m in mismatch), mismatch
    assert after >= before + 0.15, f"held-out mean reward {before:.3f} -> {after:.3f}"
