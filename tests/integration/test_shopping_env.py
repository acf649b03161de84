"""The shopping env end to end with a real model: `seal rollout` and `seal eval` on vLLM CPU, the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from env_pool import tags as T
from env_pool.shopping.tasks import CATEGORIES, get_task


def seal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )


def test_rollout_and_eval_play_whole_tagged_episodes(tmp_path):
    out = tmp_path / "r.jsonl"
    proc = seal(
        "rollout",
        "--tasks",
        "3",
        "--n",
        "2",
        "--out",
        str(out),
        "env=shopping",
        "model=tiny",
        "sampling.max_new_tokens=16",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and {r["task_id"] for r in rows} == {"shop_0", "shop_1", "shop_2"}
    for r in rows:
        task = get_task(r["task_id"])
        # One tag and one label per user turn, both vocabularies, whatever the random model wrote.
        assert r["category"] == task.category and r["outcome"] in ("completed", "step_limit")
        assert len(r["tags"]) == len(r["labels"]) == task.num_turns and r["reward"] in (0, 1)
        assert set(r["tags"]) <= set(T.RELEASED_TAGS) and set(r["labels"]) <= set(T.PAPER_LABELS)
        assert sum(r["loss_mask"]) == r["num_generated_tokens"] > 0
    proc = seal("eval", "--split", "test", "--limit", "3", "--json", "env=shopping", "model=tiny")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tasks"] == 3 and result["skipped"] == 0 and set(result["by_category"]) == set(CATEGORIES)
