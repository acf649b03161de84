"""A bf16 learner meeting new batch shapes every step keeps a flat heap (learner/onednn_caches.py).

Runs in a fresh process (the caches' bounds are read once per process). Without the bounds, the
tiny model grew about 8 MB a step here (330 MB -> 970 MB in 40 steps); with them it is flat after
its first steps. Skips on a processor without native bf16 (there no oneDNN bf16 matmuls run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from weights.precision import BF16_CPU_FLAGS, read_cpu_flags

pytestmark = [
    pytest.mark.skipif(
        not set(BF16_CPU_FLAGS) & read_cpu_flags(),
        reason=f"this CPU has none of {', '.join(BF16_CPU_FLAGS)}: dtype auto is fp32 here",
    ),
]

PROBE = r"""
import json, random, sys
from env_pool import tags as T
from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from learner.rank import _release_free_memory
from replay.messages import Segment, Trajectory
from weights.model_assets import prepare_tiny_model

N = 4

def anon_mb():
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    return int(status["RssAnon"].split()[0]) / 1024

def group(seed):
    # One packed group of N with a shared prompt, every length new: as rollouts arrive.
    rng = random.Random(seed)
    prompt = [rng.randrange(100, 5000) for _ in range(rng.randint(60, 160))]
    out = []
    for i in range(N):
        ids = prompt + [rng.randrange(100, 5000) for _ in range(rng.randint(5, 64))]
        mask = [0] * len(prompt) + [1] * (len(ids) - len(prompt))
        out.append(Trajectory(task_id="t", category="base", env="toy", group_id=f"g{seed}", rollout_index=i,
            interface_version=0, token_ids=ids, loss_mask=mask,
            logprobs=[-rng.uniform(0.5, 8) if m else 0.0 for m in mask], prompt_length=len(prompt),
            segments=[Segment(len(prompt), len(ids), 0)], reward=float(i % 2), success=bool(i % 2),
            progress=0.5, tags=[T.PASS if i % 2 else T.STATE_MISMATCH], labels=[T.PASS], error_type=None,
            outcome="completed", num_tool_calls=1, num_steps=1))
    return out

cfg = LearnerConfig(backend="torch", lr=1e-6, weight_decay=0.0, mini_batch_groups=1, micro_batch_size=N,
                    shared_prefix=True, loss=LossConfig(kl_coef=0.001), dtype="bfloat16")
lrn = Learner(str(prepare_tiny_model()), cfg, group_size=N, world_size=1, timeout_s=120.0, step_timeout_s=3600.0)
anon = []
for step in range(int(sys.argv[1])):
    lrn.train_batch(group(step), RELEASED_BASE_WEIGHTS)
    _release_free_memory()  # as LearnerRank does after each step
    anon.append(anon_mb())
print(json.dumps(anon))
"""


def test_a_bf16_learner_on_new_shapes_every_step_keeps_a_flat_heap():
    env = {k: v for k, v in os.environ.items() if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", PROBE, "60"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    anon = json.loads(out.stdout.strip().splitlines()[-1])
    growth = max(anon[20:]) - anon[20]  # after 20 steps of warm-up (allocator pools, first buffers)
    print(f"anon MB: step 0 {anon[0]:.0f}, step 20 {anon[20]:.0f}, max after {max(anon[20:]):.0f}")
    assert growth < 40, f"the learner's heap grew {growth:.0f} MB over 40 steps of new shapes: {anon[20::10]}"
