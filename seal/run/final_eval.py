"""The end of `seal train`: A_0, the run's final snapshot (and, with
``evaluation.final_snapshots: all``, every snapshot between) evaluated frozen, on the
env's test split, raw interface, greedy (evaluation/frozen.py), after the pipeline
has closed (its CPUs and memory are free again).

One engine serves every snapshot: it starts on A_0's weights and then loads each
later snapshot's from its directory, as a weight update does, so the evaluation pays
one engine start. Results land in RUN_DIR/evaluation/final.json, the closing note
(seal/run/summary.py) prints them, and TensorBoard gets them as `eval/` scalars at
A_0's step and the final step.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from evaluation.frozen import FINAL_FILE, FINAL_TASKS_FILE, final_record, final_tasks, play_snapshot, write_final
from rollout.generator import SamplingConfig
from seal.chat_setup import chat_tokenizer
from seal.config import instantiate
from seal.console import output_to_file
from seal.run.snapshots import read_snapshots, snapshot_weights
from seal.runtime.generator_spec import local_generator

if TYPE_CHECKING:
    from evaluation.config import EvalConfig

FINAL_LOG = "final.log"


def final_sampling(cfg) -> Any:
    """Greedy, with the generation budget the run trained with (evaluation.max_new_tokens wins)."""
    budget = eval_config(cfg).max_new_tokens or cfg.sampling.max_new_tokens
    return SamplingConfig(temperature=0.0, top_p=1.0, max_new_tokens=int(budget))


def eval_config(cfg) -> EvalConfig:
    """The ``evaluation`` group, typed (evaluation.config.EvalConfig, checked when built)."""
    return instantiate(cfg.evaluation)


def run_final_evaluation(cfg, run_dir: Path, emit=None) -> dict[str, Any] | None:
    """Evaluate A_0 and the final snapshot; the record written to final.json, or None when
    the run has no later snapshot than A_0 or `evaluation.final=false`."""
    emit = emit or (lambda *_: None)
    (Path(run_dir) / "evaluation" / FINAL_FILE).unlink(missing_ok=True)  # a resumed run's earlier one is stale
    evaluation = eval_config(cfg)
    if not evaluation.final:
        return None
    records = read_snapshots(run_dir)
    if len(records) < 2:
        emit("eval", "no snapshot after A_0: nothing to compare")
        return None
    chosen = records if evaluation.final_snapshots == "all" else [records[0], records[-1]]
    first, last = chosen[0], chosen[-1]
    env_node = OmegaConf.create(OmegaConf.to_container(cfg.env, resolve=True))
    make_env = lambda: instantiate(env_node)  # one env per episode
    tasks = final_tasks(make_env().task_ids("test"), list(evaluation.heldout_categories), evaluation.final_per_category)
    sampling = final_sampling(cfg)
    details = Path(run_dir) / "evaluation" / FINAL_TASKS_FILE
    details.unlink(missing_ok=True)  # a resumed run evaluates again: its last snapshot is new
    names = (
        f"{first['name']} and {last['name']}"
        if len(chosen) == 2
        else f"{len(chosen)} snapshots ({first['name']} to {last['name']})"
    )
    emit(
        "eval",
        f"frozen evaluation of {names}: {len(tasks.task_ids)} test tasks, raw interface, "
        f"greedy, {sampling.max_new_tokens} new tokens per step",
    )
    log = Path(run_dir) / "evaluation" / FINAL_LOG
    emit("eval", f"the engine's own output goes to {log}")
    with output_to_file(log):  # vLLM's start-up and weight-load chatter, not the user's terminal
        generator = local_generator(cfg.generator, model_path=snapshot_weights(run_dir, first), seed=int(cfg.seed))
    try:
        chat = chat_tokenizer(cfg, generator.tokenizer)
        runs = []
        for i, record in enumerate(chosen):
            with output_to_file(log):
                if i:
                    generator.update_weights(int(record["policy_version"]), snapshot_weights(run_dir, record))
                got = play_snapshot(record["name"], make_env, generator, chat, tasks, sampling, int(cfg.seed), details)
            runs.append(got)
            solved = sum(ok for _, ok in got.results.values())
            emit("eval", f"{record['name']}: {solved}/{len(got.results)} tasks solved in {got.wall_s:.0f} s")
    finally:
        with output_to_file(log):
            generator.close()
            del generator
            gc.collect()
    settings = {
        "interface": "raw",
        "temperature": 0.0,
        "max_new_tokens": sampling.max_new_tokens,
        "rollouts_per_task": 1,
        "seed": int(cfg.seed),
        "split": "test",
        "per_category": evaluation.final_per_category,
    }
    record = final_record(runs, {r["name"]: int(r["step"]) for r in chosen}, tasks, settings)
    write_final(run_dir, record)
    _to_tensorboard(Path(run_dir), record)
    return record


def _to_tensorboard(run_dir: Path, record: dict[str, Any]) -> None:
    """eval/<row>/success at every evaluated snapshot's step: the before/after chart's points."""
    from torch.utils.tensorboard import SummaryWriter

    steps = record["settings"]["steps"]
    writer = SummaryWriter(str(run_dir / "tensorboard"))
    try:
        for row in record["rows"]:
            tag = f"eval/{row['name'].replace(' ', '_').replace('(', '').replace(')', '')}"
            for point in record["curve"]:
                if row["name"] in point["rows"]:
                    writer.add_scalar(f"{tag}/success", point["rows"][row["name"]]["rate"], steps[point["name"]])
    finally:
        writer.close()
