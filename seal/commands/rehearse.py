"""`seal rehearse recipe=NAME [overrides]`: a GPU recipe's topology run on CPUs before anyone rents GPUs.

The rehearsal is the recipe's own `seal train` with the parts a CPU cannot run swapped out and
nothing else: a Ray cluster of the recipe's nodes (local logical nodes, seal/commands/rehearse_cluster.py,
or the user's CPU nodes with cluster.address), each declaring the recipe's GPUs as logical Ray
GPUs, so the learner's placement group, the replicas' node choice and every actor's GPU ask take
the GPU path; the recipe's learner world size and ZeRO stage; its generator replicas with their
tensor-parallel size, weight sync and update mode on vLLM's CPU backend; the learner's weight
group with gloo (vLLM's weight-transfer interface, ``seal_gloo``) standing in for NCCL call for
call; async mode, a checkpoint every step and the closing snapshot; a tiny model (fp32, CPU) in
place of the recipe's, the toy env, two rollouts per group and one group per learner rank.

It then checks what a GPU run needs (seal/commands/rehearse_report.py): every rank and replica on the node
`seal plan` puts it, every group formed with its world size, every replica confirming every
version with a canary within bounds, every rank's checkpoint shard, the snapshot. Any failure
(a crash too, which is what a rehearsal is for) is one line and exit status 2.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from learner.ds_config import effective_zero_stage
from seal.commands.preflight import one_line, preflight
from seal.commands.rehearse_cluster import LocalCluster, MemorySampler, Watchdog, alive_nodes, node_specs
from seal.commands.rehearse_probe import RehearsalPipeline
from seal.commands.rehearse_report import (
    Landing,
    NodeShape,
    Report,
    checkpoint_problems,
    checkpoint_shards,
    compare_placement,
    plan_shapes,
    report_text,
    write_report,
)
from seal.config import Settings, compose, instantiate
from seal.errors import CliError
from seal.estimate.plan import build_plan
from seal.run.progress import Progress
from seal.run.run_dir import create_run_dir
from seal.run.snapshots import read_snapshots
from seal.run.task_fit import select_tasks
from seal.runtime.generator_spec import is_async_engine
from seal.runtime.storage import checkpoint_dir
from weights.model_assets import prepare_tiny_tp_model

STEPS = 2
MAX_MODEL_LEN = 2048
# The rehearsal's waits: a hang shows in minutes, not after the recipe's hour-long step timeout.
TIMEOUTS = {"learner.timeout_s": 300.0, "learner.step_timeout_s": 900.0, "generator.update_timeout_s": 300.0}
# Engine settings of the recipe's generator kept on the CPU engine (the others are CUDA's: dtype, memory share).
CARRIED = ("tensor_parallel_size", "replicas", "weight_sync", "update_mode", "enable_prefix_caching", "max_num_seqs")

NOT_REHEARSED = [
    "NCCL itself: gloo carries the learner's training group and the weight group (the same calls and ranks); NCCL-only "
    "faults (a collective on a CPU tensor, communicator timeouts and watchdogs, NVLink/InfiniBand topology) need a GPU",
    "CUDA memory: `seal plan`'s estimate per rank and replica is not measured here (scripts/gpu_check.sh measures one GPU)",
    "bf16 and CUDA kernels: the rehearsal computes in fp32 on CPU (the learner's bf16 autocast, vLLM's CUDA graphs and "
    "attention kernels are not run)",
    "the seal_nccl weight-transfer engine: seal_gloo (the same engine over gloo) stands in behind the same vLLM calls "
    "(init_weight_transfer_engine, start_weight_update, update_weights, finish_weight_update)",
    "the recipe's model: a tiny Llama stands in (architecture, size and load time differ)",
]


def rehearsal_model(tp: int) -> str:
    """model.path for the rehearsal: the bundled tiny model when ``tp`` splits its 2 heads, else a
    tiny model with 8 attention / 4 KV heads (prepared once, cached beside it) that TP 4 and 8 split."""
    if tp in (1, 2):
        return "tiny"
    if 8 % tp:
        raise CliError(
            f"generator.tensor_parallel_size={tp}: the rehearsal's tiny models split over 1, 2, 4 or 8 workers"
        )

    return str(prepare_tiny_tp_model())


def rehearsal_overrides(
    target: Settings, user: list[str], address: str, run_dir: str, steps: int, model: str, local: bool
) -> list[str]:
    """The `seal train` overrides of the rehearsal: the user's (the recipe among them), then the CPU stand-ins;
    ``target``: the recipe's typed groups; ``local``: ``address`` is the rehearsal's own cluster (no token
    to join it with)."""
    world, gen = target.learner.world_size, target.generator
    engine = "vllm_async_cpu" if is_async_engine(gen.target) else "vllm_cpu"
    out = [
        *user,
        f"generator={engine}",
        "env=toy",
        "env.step_limit=1",
        "limit=null",
        "n=2",
        "sampling.max_new_tokens=16",
        f"model.path={model}",
        f"model.max_model_len={MAX_MODEL_LEN}",
        "generator.dtype=float32",
        "generator.cpu_kv_cache_gb=0.0625",  # 64 MiB a worker: 16 sequences of 2048 tokens; 8 TP workers held 8 GiB at 1
        "learner.cfg.device=cpu",
        "learner.cfg.dtype=float32",
        f"learner.cfg.mini_batch_groups={world}",
        f"trainer.groups_per_step={world}",
        f"trainer.steps={steps}",
        "trainer.checkpoint_every=1",
        "trainer.snapshot_every=0",
        "trainer.filter_groups=none",
        "trainer.oversample=0",
        "trainer.mode=async",
        f"run_dir={run_dir}",
        "cluster.env_actors=2",
        "cluster.learner.threads=1",
        "cluster.generator.threads=1",
    ]
    for key in CARRIED:
        value = getattr(gen, key)
        if value is not None:  # None: the recipe's engine has no such setting
            out.append(f"++generator.{key}={json.dumps(value) if isinstance(value, str) else value}")
    timeouts = {
        "learner.timeout_s": target.learner.timeout_s,
        "learner.step_timeout_s": target.learner.step_timeout_s,
        "generator.update_timeout_s": gen.update_timeout_s,
    }
    for key, limit in TIMEOUTS.items():
        now = timeouts[key]
        out.append(f"{key}={min(float(now), limit) if now is not None else limit:g}")
    out.append(f"cluster.address={address}")
    if local:
        out.append("cluster.ray_auth=disabled")
    return out


def user_address(user: list[str]) -> str | None:
    """The cluster the user named on the command line (cluster.address=...): rehearse on its nodes.
    A recipe's own ``address: auto`` (cluster=multinode) is the GPU cluster's, not a CPU one's."""
    named = [o.split("=", 1)[1] for o in user if o.lstrip("+").startswith("cluster.address=")]
    return named[-1] if named and named[-1] not in ("null", "None", "") else None


def _plan_nodes(plan) -> list[dict[str, Any]]:
    if plan.layout is None:
        return []
    return [
        {"name": n.name, "learner": s.learners, "generator": s.generators}
        for n, s in zip(plan.layout.nodes, plan_shapes(plan.layout))
    ]


def run(args) -> int:
    """The `seal rehearse` handler."""
    user = list(args.overrides)
    try:
        target = compose(user)  # the GPU configuration as `seal train` would run it
        settings = Settings.of(target)
        cluster = instantiate(target.cluster)
        plan = build_plan(target, query=False, settings=settings)
    except (ValueError, KeyError, OSError) as exc:
        raise CliError(one_line(exc)) from None
    recipe = settings.recipe or "the composed config"
    hardware = cluster.hardware
    address = user_address(user)
    if hardware is None and not address:
        raise CliError(
            "seal rehearse needs the nodes to rehearse: cluster.hardware (nodes, gpus_per_node, cpus_per_node) "
            "as the recipes set it, or cluster.address of a running CPU cluster"
        )
    steps = int(getattr(args, "steps", None) or STEPS)
    run_dir = Path(
        str(target.run_dir or Path("runs") / f"rehearse-{recipe.replace(' ', '_')}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    tp = settings.generator.tensor_parallel_size
    report = Report(
        recipe=recipe,
        command="",
        cluster={},
        plan=_plan_nodes(plan),
        run_dir=str(run_dir),
        not_rehearsed=list(NOT_REHEARSED),
    )
    report.failures += [f"seal plan cannot place the recipe: {p}" for p in plan.problems if "cannot be placed" in p]
    report.failures += [f"seal plan: {p}" for p in plan.problems if "cannot be placed" not in p]
    if any("cannot be placed" in p for p in plan.problems):
        return _finish(report, args)  # nothing to rehearse: the cluster could not start it either
    if not address:  # on the user's CPU nodes the network between them is real
        report.not_rehearsed.append(
            "the network between nodes: the logical nodes share this machine's address "
            "(tests/integration/test_two_hosts.py runs two real hosts)"
        )
    _rehearse(
        report,
        settings,
        user,
        address,
        hardware,
        run_dir,
        steps,
        tp,
        float(getattr(args, "timeout", None) or 1800.0),
        quiet=bool(getattr(args, "json", False) or getattr(args, "quiet", False)),
    )
    return _finish(report, args)


def _finish(report, args) -> int:
    write_report(report, Path(report.run_dir))
    if getattr(args, "json", False):
        print(json.dumps(report.to_json(), default=str), flush=True)
    else:
        print(report_text(report), flush=True)
    if not report.ok:
        raise CliError(report.verdict())
    return 0


def _rehearse(
    report, target: Settings, user, address, hardware, run_dir: Path, steps: int, tp: int, timeout_s: float, quiet: bool
) -> None:
    memory = MemorySampler().start()
    watchdog = Watchdog(timeout_s)
    local = None
    started = time.monotonic()
    pipeline = None
    try:
        watchdog.start()
        watchdog.phase = "preparing the tiny model"
        model = rehearsal_model(tp)
        if not address:
            watchdog.phase = "starting the local cluster"
            local = LocalCluster(node_specs(hardware)).start()
        overrides = rehearsal_overrides(
            target, user, address or local.address, str(run_dir), steps, model, local is not None
        )
        report.command = "seal train " + " ".join(overrides)
        report.cluster = {
            "kind": f"the cluster at {address}"
            if address
            else f"a local Ray cluster of {len(local.nodes)} logical node{'s' * (len(local.nodes) > 1)} "
            f"x {hardware.gpus_per_node} logical GPUs",
            "address": address or local.address,
            "ray_logs": local.logs_dir() if local is not None else "each node's /tmp/ray/session_latest/logs",
        }
        pipeline = _start_pipeline(overrides, run_dir, Progress(quiet=quiet), watchdog)
        report.cluster["nodes"] = alive_nodes()
        watchdog.phase = f"running {steps} steps"
        pipeline.run(steps)
        watchdog.phase = "waiting for the last weight updates"
        pipeline.drain(timeout_s=300.0)
    except KeyboardInterrupt:
        if watchdog.reason is None:
            raise
        report.failures.append(watchdog.reason)
    except Exception as exc:  # a crash is what a rehearsal reports
        report.failures.append(f"{failure_line(exc)} (while {watchdog.phase})")
    finally:
        watchdog.stop()
        try:
            if pipeline is not None:
                _read_out(report, pipeline, steps)
        finally:
            if pipeline is not None:
                pipeline.close()
            if local is not None:
                local.close()
            report.wall_s = time.monotonic() - started
            report.peak_rss_gb = memory.stop()


def failure_line(exc: BaseException) -> str:
    """One line for what stopped the run. Ray's memory monitor killing an actor is this machine running
    out of memory, not the topology failing: said so, without Ray's advice paragraph."""
    text = one_line(getattr(exc, "error_msg", None) or exc) or exc.__class__.__name__
    if "out of memory" in text.lower() or "OutOfMemoryError" in text:
        head = text.split(": Refer to the documentation")[0].split(": Task was killed")[0]
        return (
            f"{head}: killed by Ray's memory monitor: this machine ran out of memory for the rehearsal "
            f"(a limit of the machine rehearsing, not of the topology; more memory or fewer other processes)"
        )
    # Ray's guesses at why a worker died follow its facts; the actor's stack is in Ray's worker log.
    cut = text.split(" Some common causes include")[0]
    return (cut + " (its stack: worker-*.err under the report's Ray logs)" if cut != text else text)[:600]


def _start_pipeline(overrides: list[str], run_dir: Path, progress, watchdog):
    watchdog.phase = "checking the rehearsal's config"
    cfg, settings = preflight(overrides)
    tasks = select_tasks(cfg)
    run_dir = create_run_dir(str(run_dir), cfg, overrides)
    watchdog.phase = "starting the learner group and the generator replicas"
    return RehearsalPipeline(cfg, run_dir, None, progress=progress, tasks=tasks, settings=settings)


def _read_out(report, pipeline, steps: int) -> None:
    """Everything the report states, read from the pipeline and its run directory; judged here."""
    ranks, replicas = _read_placement(report, pipeline)
    _read_groups(report, pipeline, ranks, replicas)
    _read_weights(report, pipeline, replicas)
    _read_steps(report, pipeline, steps)


def _read_placement(report, pipeline) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Where every learner rank and generator replica landed, against `seal plan`'s nodes."""
    gpus = pipeline.cluster.generator.num_gpus
    try:
        ranks = pipeline.learner_ranks()
    except Exception as exc:  # the group is gone (a rank died): its nodes are still known
        ranks = (
            [{**node, "rank": r} for r, node in enumerate(pipeline.actors.learners.nodes)] if pipeline.actors else []
        )
        report.failures.append(f"the learner group does not answer after the run: {str(exc).splitlines()[0][:300]}")
    replicas = pipeline.replica_nodes() if pipeline.actors else {}
    report.landings = [
        Landing(
            "learner", f"rank {r['rank']}", r.get("node_id", "?"), r.get("ip", "?"), pipeline.cluster.learner.num_gpus
        )
        for r in ranks
    ] + [Landing("generator", name, n["node_id"], n["ip"], gpus) for name, n in replicas.items()]
    node_ids = [n["node_id"] for n in report.cluster.get("nodes", [])]
    if report.plan and report.landings:
        report.failures += compare_placement(
            [NodeShape(p["learner"], p["generator"]) for p in report.plan], report.landings, node_ids
        )
    return ranks, replicas


def _read_groups(report, pipeline, ranks: list[dict[str, Any]], replicas: dict[str, dict[str, Any]]) -> None:
    """The learner's training group (ZeRO's partition) and the weight group, with their world sizes."""
    learner = pipeline.settings.learner  # the rehearsal's own run: the recipe's ranks on the CPU
    world, stage, deepspeed = learner.world_size, learner.cfg.zero_stage, learner.backend == "deepspeed"
    tp = pipeline.settings.generator.tensor_parallel_size
    shares = [f"rank {r['rank']} holds {r['held'] / r['total']:.0%}" for r in ranks if r.get("total")]
    report.groups.append(
        {
            "name": "learner training group",
            "world_size": len(ranks),
            "backend": "gloo (nccl on the GPUs)",
            "detail": f"ZeRO-{stage}" + (": " + ", ".join(shares) + " of the parameters" if shares else ""),
        }
    )
    if deepspeed and stage == 3 and world > 1 and any(r.get("held") == r.get("total") for r in ranks if r.get("total")):
        report.failures.append(f"ZeRO-3 did not partition the model over the {world} learner ranks")
    for g in getattr(pipeline, "weight_groups", []):
        want = 1 + len(replicas) * tp
        report.groups.append(
            {
                "name": "weight group",
                "world_size": g["world_size"],
                "backend": f"{g['backend']} through vLLM's weight-transfer engine seal_gloo (seal_nccl on the GPUs)",
                "detail": ", ".join(f"{k}: ranks {v}" for k, v in g["ranks"].items())
                + f"; {g['tensors']} tensors a round",
            }
        )
        if g["world_size"] != want:
            report.failures.append(
                f"the weight group has {g['world_size']} ranks where 1 + {len(replicas)} replicas x TP {tp} = {want}"
            )
    if pipeline.settings.generator.weight_sync == "broadcast" and not getattr(pipeline, "weight_groups", []):
        report.failures.append("the weight group (weight_sync=broadcast) never formed")


def _read_weights(report, pipeline, replicas: dict[str, dict[str, Any]]) -> None:
    """Each replica's confirmed weight versions and canaries; the fleet's failures."""
    final = pipeline.state.version if hasattr(pipeline, "state") else 0
    limit = pipeline.trainer.canary_max_logprob_diff
    for name in replicas:
        records = getattr(pipeline, "updates", {}).get(name, {})
        report.weights[name] = [records[v] for v in sorted(records)]
        missing = [v for v in range(1, final + 1) if not records.get(v, {}).get("confirmed")]
        if missing:
            report.failures.append(
                f"generator replica {name} did not confirm weight version(s) {', '.join(map(str, missing))}"
            )
        worst = [
            (v, r["canary_diff"])
            for v, r in records.items()
            if r.get("canary_diff") is not None and r["canary_diff"] > limit
        ]
        if worst:
            report.failures.append(
                f"generator replica {name}: canary logprobs differ from the learner's by {worst[0][1]:.3g} "
                f"(> {limit:g}) at v{worst[0][0]}"
            )
        if final and not any(r.get("canary_diff") is not None for r in records.values()):
            report.failures.append(f"generator replica {name}: no canary came back")
    fleet = pipeline.actors.generators if pipeline.actors else None
    if fleet is not None and (
        fleet.counters.restores or fleet.counters.update_timeouts or fleet.counters.canary_failures
    ):
        c = fleet.counters
        report.failures.append(
            f"generator replicas failed during the rehearsal: {', '.join(c.failed_replicas) or '?'} "
            f"({c.update_timeouts} update timeouts, {c.canary_failures} canary failures, {c.restores} restores)"
        )


def _read_steps(report, pipeline, steps: int) -> None:
    """Every rank's checkpoint shard, the closing snapshot and the step times."""
    learner = pipeline.settings.learner
    world, deepspeed = learner.world_size, learner.backend == "deepspeed"
    report.checkpoints = checkpoint_shards(checkpoint_dir(pipeline.storage))
    rows = _metrics(pipeline.run_dir)
    report.steps = [
        {
            "step": r["step"],
            "step_s": r.get("step_s", 0.0),
            "learner_s": (r.get("wait_s") or {}).get("learner"),
            "publish_s": r.get("publish_s"),
        }
        for r in rows
    ]
    rounds_failed = max((int(r.get("weight_rounds_failed") or 0) for r in rows), default=0)  # cumulative per run
    if rounds_failed:
        report.failures.append(
            f"{rounds_failed} weight broadcast round(s) failed (a replica left the weight group; see the run log)"
        )
    if len(rows) < steps and not report.failures:
        report.failures.append(f"{len(rows)} of {steps} steps finished")
    if rows:
        zero_shards = effective_zero_stage(learner.cfg, world) > 0  # ZeRO-1/2 on one rank runs stage 0
        report.failures += checkpoint_problems(report.checkpoints, world, deepspeed, zero_shards)
        report.snapshot = _snapshot(pipeline.run_dir, steps)
        if not report.snapshot.get("files") and len(rows) >= steps:
            report.failures.append(f"the closing snapshot has no weights ({report.snapshot.get('weights')})")


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _snapshot(run_dir: Path, steps: int) -> dict[str, Any]:
    try:
        last = read_snapshots(Path(run_dir))[-1]
    except (FileNotFoundError, IndexError):
        return {}
    if not last["step"]:  # A_0: the base model, written before any step
        return {}
    weights = Path(run_dir) / last["weights"]
    files = sorted(p.name for p in weights.iterdir()) if weights.is_dir() else []
    return {
        "name": last["name"],
        "step": last["step"],
        "policy_version": last["policy_version"],
        "weights": str(weights),
        "files": len(files),
        "file_names": files,
    }
