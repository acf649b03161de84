"""`seal train`: the main job, the actor-learner pipeline on Ray (seal/pipeline.py).

Writes a run directory: config.yaml (resolved), run.json (overrides, seed,
code version), metrics.jsonl, rounds.jsonl (per-round failure profile and
interface state), tensorboard/, checkpoints/latest, control.json while it runs.
"""
from __future__ import annotations

from pathlib import Path


def run(args) -> int:
    from seal.preflight import preflight

    # Every config error is one line here, before a run directory or Ray exists.
    cfg = preflight(args.overrides)
    if getattr(args, "cfg", False):
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(cfg, resolve=True), end="")
        return 0
    from tqdm import tqdm

    from seal.pipeline import Pipeline
    from seal.run_dir import create_run_dir

    resume = Path(cfg.resume) if cfg.resume else None
    run_dir = create_run_dir(str(resume) if resume else cfg.run_dir, cfg, list(args.overrides))
    learner = f"ZeRO-{cfg.learner.cfg.zero_stage}" if cfg.learner.cfg.backend == "deepspeed" else "torch"
    print(f"run dir: {run_dir}")
    print(f"starting Ray ({cfg.cluster.address or 'local'}): mode={cfg.trainer.mode} env={cfg.env._target_.rsplit('.', 1)[-1]} "
          f"model={cfg.model.path} learner={learner} env_actors={cfg.cluster.env_actors}; "
          f"{cfg.trainer.steps} steps x {cfg.trainer.groups_per_step} groups x {cfg.n} rollouts", flush=True)
    pipeline = Pipeline(cfg, run_dir, resume)
    try:
        if pipeline.skipped_overlong:
            print(f"skipping {pipeline.skipped_overlong} tasks whose opening prompt does not fit the model's context "
                  f"({cfg.generator.max_model_len} tokens with {cfg.sampling.max_new_tokens} to answer); "
                  f"{len(pipeline.task_ids)} remain (trainer.skip_overlong=false keeps them)")
        if resume is not None:
            print(f"resumed at step {pipeline.step}, policy version {pipeline.version}")
        print(f"scale env actors while it runs: .venv/bin/seal scale {run_dir} env=N", flush=True)
        with tqdm(total=cfg.trainer.steps, desc="learner steps", unit="step") as bar:
            history = pipeline.run(cfg.trainer.steps, progress=bar)
    finally:
        pipeline.close()
    last = history[-1]
    wall = sum(h["step_s"] for h in history)
    gen_rate = sum(h["gen_tokens_per_s"] * h["step_s"] for h in history) / wall
    trained = [h for h in history if not h.get("skipped")]
    learner = (f"{sum(h['learner_samples_per_s'] for h in trained) / len(trained):.2f} learner samples/s, "
               f"staleness max {max(h['staleness_max'] for h in trained)}") if trained else "no learner update"
    filtered = sum(h.get("filtered_groups", 0) for h in history)
    print(f"step {last['step']}: reward {last['reward_mean']:.3f}, policy v{last['policy_version']}, interface v{last['interface_version']} "
          f"(guidelines: {', '.join(last['active_guidelines']) or 'none'}); over the run: {gen_rate:.1f} generated tokens/s, "
          f"{learner}; {filtered} groups filtered (equal rewards), {len(history) - len(trained)} of {len(history)} steps skipped")
    print("rewards by step: " + " ".join(f"{h['reward_mean']:.2f}" for h in history))
    print(f"snapshots: {run_dir}/snapshots; metrics: {run_dir}/metrics.jsonl; TensorBoard: .venv/bin/tensorboard --logdir {run_dir}/tensorboard")
    return 0


def scale(args) -> int:
    from seal.control import send_control

    reply = send_control(Path(args.run_dir), "scale", {"env": args.env})
    if not reply.get("ok"):
        raise ValueError(reply.get("error", "refused"))
    print(f"env actors: {reply['env_actors']}")
    return 0
