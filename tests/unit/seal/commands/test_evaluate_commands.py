"""The parts of `seal evaluate` / `seal ablate` that need no model: the result
cache, reading a run's config, the ablation configs and the ablation table."""

from __future__ import annotations

import json
import shutil

import pytest
from omegaconf import OmegaConf

from evaluation.metrics import summarize
from evaluation.records import SnapshotInfo, TaskResult
from evaluation.runner import ResultCache, missing, run_view, settings_key
from seal.commands.ablate import _compose_all, ablation_names, markdown, row
from seal.commands.evaluate import load_run_config
from seal.config import compose, config_dir, instantiate


def result(task: str, success: bool, snapshot: str = "A_0", view: str = "id") -> TaskResult:
    return TaskResult(snapshot, view, task, "add", success, float(success), 1, 10, 100, 0.5)


def test_cache_reuses_matching_results_only_and_survives_a_torn_line(tmp_path):
    key, other = settings_key(weights="w", seed=0), settings_key(weights="w", seed=1)
    calls = []

    def runner(task_ids):
        calls.extend(task_ids)
        return [result(t, t == "toy_0") for t in task_ids]

    cache = ResultCache(tmp_path, "A_0")
    first = run_view(["toy_0", "toy_1"], cache=cache, key=key, view="id", runner=runner)
    assert calls == ["toy_0", "toy_1"] and [r.success for r in first] == [True, False]
    with open(tmp_path / "A_0.jsonl", "a") as f:
        f.write('{"key": "' + key + '", "result": {"task_')  # a write cut short by a crash
    again = ResultCache(tmp_path, "A_0")
    assert run_view(["toy_0", "toy_1"], cache=again, key=key, view="id", runner=runner) == first and len(calls) == 2
    # The same task in another view is reused, relabelled; other settings are a miss.
    (hit,) = run_view(["toy_0"], cache=again, key=key, view="replay", runner=runner)
    assert hit.view == "replay" and hit.success and len(calls) == 2
    assert missing({"id": ["toy_0", "toy_1"], "v2": ["toy_0", "toy_2"]}, again, {"id": key, "v2": other}) == 2
    run_view(["toy_0"], cache=again, key=other, view="id", runner=runner)
    assert calls[-1] == "toy_0" and len(calls) == 3


def test_a_view_plays_its_uncached_tasks_in_batches_and_caches_each_batch(tmp_path):
    key, batches, seen = settings_key(weights="w"), [], []

    def runner(task_ids):
        batches.append(list(task_ids))
        if "toy_4" in task_ids:
            raise KeyboardInterrupt  # the user stops it mid-view
        return [result(t, True) for t in task_ids]

    cache = ResultCache(tmp_path, "A_0")
    cache.put(key, result("toy_1", False))
    tasks = [f"toy_{i}" for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        run_view(
            tasks,
            cache=cache,
            key=key,
            view="id",
            runner=runner,
            batch=2,
            progress=lambda n, ran: seen.append((n, ran)),
        )
    assert batches == [["toy_0", "toy_2"], ["toy_3", "toy_4"]] and seen == [(1, False), (2, True)]
    again = ResultCache(tmp_path, "A_0")  # the finished batch was kept
    assert missing({"id": tasks}, again, {"id": key}) == 3
    out = run_view(tasks, cache=again, key=key, view="id", runner=lambda ids: [result(t, True) for t in ids], batch=64)
    assert [r.task_id for r in out] == tasks and [r.success for r in out] == [True, False, True, True, True, True]


def _write_run_config(run_dir, *overrides, drop_evaluation=False):
    cfg = compose(["env=toy", "model=tiny", *overrides])
    if drop_evaluation:
        OmegaConf.set_struct(cfg, False)
        del cfg["evaluation"]
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))


def test_run_config_keeps_the_runs_split_settings_and_fills_an_old_run(tmp_path):
    _write_run_config(tmp_path / "new", "evaluation.validation_size=12", "trainer.snapshot_every=3")
    cfg = load_run_config(tmp_path / "new", ["evaluation.max_new_tokens=64", "evaluation.views=[id,replay]"])
    ev = instantiate(cfg.evaluation)
    assert ev.validation_size == 12 and ev.max_new_tokens == 64 and ev.views == ("id", "replay")
    assert ev.schedule["assessment_timing"] == 3  # the interpolation resolves against the run's own trainer settings
    with pytest.raises(ValueError, match="must stay what the run trained with"):
        load_run_config(tmp_path / "new", ["evaluation.validation_size=0"])
    _write_run_config(tmp_path / "old", drop_evaluation=True)
    assert instantiate(load_run_config(tmp_path / "old", []).evaluation).validation_size == 40
    with pytest.raises(FileNotFoundError):
        load_run_config(tmp_path / "missing", [])


def test_ablation_configs_change_what_they_name():
    assert set(ablation_names()) >= {"vanilla_rl", "no_interface_evolution", "no_reweighting", "no_closed_loop"}
    base = compose([])
    assert base.interface.schema_lite and base.learner.cfg.apatch.enabled and base.trainer.closed_loop
    got = {n: compose([f"ablation={n}", "learner=torch"]) for n in ablation_names()}
    assert not got["vanilla_rl"].interface.schema_lite and not got["vanilla_rl"].learner.cfg.apatch.enabled
    assert got["vanilla_rl"].tag_weights.cfg.beta == 0.0
    assert (
        not got["no_interface_evolution"].interface.guidelines
        and got["no_interface_evolution"].learner.cfg.apatch.enabled
    )
    assert not got["no_reweighting"].learner.cfg.apatch.enabled and got["no_reweighting"].interface.schema_lite
    assert got["no_closed_loop"].trainer.closed_loop is False and got["no_closed_loop"].learner.cfg.apatch.enabled
    assert all(c.ablation.name == n for n, c in got.items())


def test_ablations_must_share_seed_split_and_budget(tmp_path, monkeypatch):
    plan = _compose_all(["full", "no_reweighting"], ["env=toy", "seed=3", "trainer.steps=5"])
    assert plan["settings"]["seed"] == 3 and plan["settings"]["trainer.steps"] == 5
    configs = tmp_path / "configs"
    shutil.copytree(config_dir(), configs)
    (configs / "ablation" / "cheat.yaml").write_text(
        "# @package _global_\nablation: {name: cheat}\ntrainer:\n  steps: 50\n"
    )
    monkeypatch.setenv("SEAL_CONFIG_DIR", str(configs))
    with pytest.raises(ValueError, match="trainer.steps"):
        _compose_all(["full", "cheat"], ["env=toy"])


def test_ablation_row_reads_final_and_best_validation():
    snaps = [
        SnapshotInfo("A_0", 0, 0, 0),
        SnapshotInfo("A_1", 5, 5, 1, wall_s=10.0, update_tokens=500),
        SnapshotInfo("A_2", 10, 10, 2, wall_s=20.0, update_tokens=900),
    ]
    val = {"A_0": [0, 0], "A_1": [1, 1], "A_2": [1, 0]}
    results = [result(f"toy_{i}", bool(v), s, "validation") for s, vs in val.items() for i, v in enumerate(vs)]
    results += [result("toy_9", s != "A_0", s, "id") for s in val]
    r = row("no_reweighting", "A-Patch off", json.loads(json.dumps(summarize(results, snaps))))
    assert r["final"] == "A_2" and r["final_validation"] == 0.5 and r["best_validation"] == "A_1"
    assert r["best_validation_id"] == 1.0 and r["id_gain"] == 1.0 and r["final_ood"] is None
    assert r["update_tokens"] == 900 and r["train_wall_s"] == 20.0
    table = markdown([r], {"seed": 0})
    assert "| no_reweighting | 50.0 | 100.0 | n/a |" in table and "A-Patch off" in table
