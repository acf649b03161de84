"""`seal train`: the main job.

Synchronous mode today (generation and learning alternate in one process,
staleness 0); the asynchronous Ray pipeline will take the same config. Writes
a run directory: config.yaml (resolved), run.json (overrides, seed, code
version), metrics.jsonl, rounds.jsonl (per-round failure profile and
interface state), tensorboard/, checkpoints/latest.
"""
from __future__ import annotations

from pathlib import Path


def run(args) -> int:
    from tqdm import tqdm

    from seal.config import compose, instantiate
    from seal.run_dir import create_run_dir
    from seal.trainer import SyncTrainer

    cfg = compose(args.overrides)
    if cfg.trainer.mode != "sync":
        raise ValueError(f"trainer.mode={cfg.trainer.mode!r}: only sync runs in this version (the async Ray pipeline is not built yet)")
    resume = Path(cfg.resume) if cfg.resume else None
    if resume is not None and not (resume / "checkpoints" / "latest").is_dir():
        raise FileNotFoundError(f"nothing to resume: no checkpoint in {resume}/checkpoints/latest")
    run_dir = create_run_dir(str(resume) if resume else cfg.run_dir, cfg, list(args.overrides))
    print(f"run dir: {run_dir}")
    print(f"starting: env={cfg.env._target_.rsplit('.', 1)[-1]} model={cfg.model.path} learner={'ZeRO-' + str(cfg.learner.cfg.zero_stage) if cfg.learner.cfg.backend == 'deepspeed' else 'torch'} "
          f"{cfg.trainer.steps} steps x {cfg.trainer.groups_per_step} groups x {cfg.n} rollouts", flush=True)
    trainer = SyncTrainer(cfg, instantiate, run_dir)
    if trainer.skipped_overlong:
        print(f"skipping {trainer.skipped_overlong} tasks whose opening prompt does not fit the model's context "
              f"({trainer.generator.max_model_len} tokens with {cfg.sampling.max_new_tokens} to answer); "
              f"{len(trainer.task_ids)} remain (trainer.skip_overlong=false keeps them)")
    if resume is not None:
        trainer.resume(resume)
        print(f"resumed at step {trainer.step}, policy version {trainer.generator.policy_version}, interface v{trainer.coordinator.interface.version}")
    with tqdm(total=cfg.trainer.steps, desc="learner steps", unit="step") as bar:
        history = trainer.run(cfg.trainer.steps, progress=bar)
    last = history[-1]
    print(f"step {last['step']}: reward {last['reward_mean']:.3f}, policy v{last['policy_version']}, interface v{last['interface_version']} "
          f"(guidelines: {', '.join(last['active_guidelines']) or 'none'}), {last['gen_tokens_per_s']:.1f} gen tokens/s, "
          f"{last['learner_samples_per_s']:.2f} learner samples/s")
    print("rewards by step: " + " ".join(f"{h['reward_mean']:.2f}" for h in history))
    print(f"metrics: {run_dir}/metrics.jsonl; TensorBoard: .venv/bin/tensorboard --logdir {run_dir}/tensorboard")
    trainer.generator.close()
    return 0
