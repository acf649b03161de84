"""What a configuration asks of the cluster, before anything starts (`seal plan`, seal/commands/plan.py).

Reads the composed config and the model's config.json (never weights), estimates the learner's
memory per rank and the generator's per replica (seal/estimate/memory.py), places the actors on the
target nodes (seal/estimate/plan_layout.py: ``cluster.hardware``, this machine, or with
``cluster.address`` the running cluster's own resources) and lists what does not fit with what
would. ``seal train`` runs the same check in its preflight (``check_fits``), refusing only a
plan that clearly cannot fit. Rendering is in seal/commands/plan_report.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from actors.generation.adapters import adapter_slots, serving_rank
from seal.cluster_config import ClusterConfig, local_gpu_count
from seal.config import GeneratorConfig, ModelConfig, Settings, config_dir, instantiate
from seal.estimate import plan_layout  # query_cluster through the module: tests stand a cluster in there
from seal.estimate.device_groups import group_problems
from seal.estimate.io_bounds import IoBounds, closing_barrier_problem, io_bounds
from seal.estimate.memory import (
    GB,
    Estimate,
    GeneratorEstimate,
    GeneratorSetup,
    LearnerSetup,
    ModelSpec,
    generator_memory,
    learner_memory,
    powers_of_two,
    smallest_fitting,
    tp_divides,
)
from seal.estimate.plan_layout import (
    Demand,
    Layout,
    hardware_nodes,
    layout_problems,
    local_machine,
    nodes_from_ray,
    place,
)
from seal.estimate.shared_gpus import SharedGpu, learner_room_gb, overcommitted, shared_gpus
from weights.model_assets import embedded_model_dir, tiny_model_dir
from weights.precision import resolve_dtype

SPECS_DIR = "model_specs"  # configs/model_specs/<name>/config.json: architecture numbers only
BUNDLED_SPECS = {"embedded": "smollm2-135m-instruct", "tiny": "tiny-llama-smollm2-tok"}
CUDA_PROCESS_HOST_GB = 4.0  # host memory of a CUDA learner rank or vLLM replica (torch, libraries)
ENV_ACTOR_HOST_GB = 0.5
DRIVER_HOST_GB = 3.0  # the driver (replay server) and Ray's own processes on the head node


@dataclass
class Plan:
    model: ModelSpec
    model_source: str
    learner: LearnerSetup
    learner_est: Estimate
    learner_capacity_gb: float | None  # one rank's device memory (None: unknown)
    generator: GeneratorSetup
    generator_est: GeneratorEstimate
    replicas: int
    hardware: str  # where the nodes came from
    layout: Layout | None
    problems: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    io: IoBounds | None = None  # how long checkpoint, resume and snapshot may take (seal/estimate/io_bounds.py)
    shared_gpus: list[SharedGpu] = field(default_factory=list)  # GPUs fractional asks share
    learner_capacity_note: str = ""  # why a learner rank's capacity is what it is (a shared GPU)

    @property
    def fits(self) -> bool:
        return not self.problems

    def verdict(self) -> str:
        """The one closing line of a plan that does not fit (what does not, what would)."""
        line = "does not fit: " + "; ".join(self.problems)
        return line + (f"; would fit: {' or '.join(self.suggestions)}" if self.suggestions else "")


# ----------------------------------------------------------------------------- reading the config
def model_config(model: ModelConfig, config_root: Path | None = None) -> tuple[dict[str, Any], str]:
    """The model's config.json and where it was read: ``model.path`` when it holds one, else the
    spec ``model.spec`` names (or the bundled models' own) under configs/model_specs/."""
    path = model.path
    candidates: list[Path] = []
    if path in BUNDLED_SPECS:
        candidates.append((embedded_model_dir() if path == "embedded" else tiny_model_dir()) / "config.json")
    else:
        candidates.append(Path(path).expanduser() / "config.json")
    spec = model.spec or BUNDLED_SPECS.get(path)
    if spec:
        candidates.append((config_root or config_dir()) / SPECS_DIR / str(spec) / "config.json")
    for c in candidates:
        if c.is_file():
            try:  # configs/model_specs/... reads better than an absolute path into the checkout
                shown = str(c.resolve().relative_to((config_root or config_dir()).resolve().parent))
            except ValueError:
                shown = str(c)
            return json.loads(c.read_text()), shown
    hint = (
        f" nor in configs/{SPECS_DIR}/{spec}"
        if spec
        else f" (model.spec=NAME reads configs/{SPECS_DIR}/NAME/config.json)"
    )
    raise FileNotFoundError(f"model.path={path}: no config.json there{hint}")


def learner_setup(cfg, s: Settings) -> LearnerSetup:
    """The learner group's settings as the estimate takes them (``cfg``: the sampling group's length)."""
    lc = s.learner.cfg
    return LearnerSetup(
        backend=lc.backend,
        zero_stage=lc.zero_stage,
        world_size=s.learner.world_size,
        device=lc.device,
        dtype=resolve_dtype(lc.dtype, lc.device)[0],
        optimizer=lc.optimizer,
        offload_optimizer=lc.offload_optimizer,
        offload_param=lc.offload_param,
        reference=bool(float(lc.loss.kl_coef)),
        gradient_checkpointing=lc.gradient_checkpointing,
        micro_batch_size=lc.micro_batch_size,
        shared_prefix=lc.shared_prefix,
        seq_len=s.generator.max_model_len,
        response_len=int(cfg.sampling.max_new_tokens),
        weight_bucket_mb=float(lc.weight_bucket_mb),
        logprob_head=lc.logprob_head,
        lora_rank=lc.lora.rank if lc.lora is not None else None,
        lora_merge_on_device=lc.lora is not None
        and lc.lora.publish == "merged"
        and s.generator.weight_sync == "broadcast",
    )


def generator_setup(g: GeneratorConfig) -> GeneratorSetup:
    return GeneratorSetup(
        device=g.device,
        dtype=resolve_dtype(g.dtype, g.device)[0],
        tensor_parallel_size=g.tensor_parallel_size,
        gpu_memory_utilization=g.gpu_memory_utilization,
        max_model_len=g.max_model_len,
        cpu_kv_cache_gb=g.cpu_kv_cache_gb,
    )


def with_adapter_slots(
    gs: GeneratorSetup, lora, reference_from_base: bool = False, max_loras: int | None = None
) -> GeneratorSetup:
    """A learner publishing adapters (learner.cfg.lora.publish: adapter) has the replicas serve them:
    vLLM's LoRA slots at the smallest rank holding the adapter, as `seal train` starts them
    (actors/generation/adapters.py ``adapter_serving_spec``; the slots ``adapter_slots``: the
    engine's 2, one more where the replicas score the KL reference, or ``max_loras`` set by hand)."""
    if lora is None or lora.rank is None or lora.publish != "adapter":
        return gs
    slots = adapter_slots(max_loras, gs.max_loras, reference_from_base)
    return replace(gs, max_lora_rank=serving_rank(int(lora.rank)), max_loras=slots)


def demands(
    cluster: ClusterConfig,
    replicas: int,
    world: int,
    learner: Estimate,
    learner_cuda: bool,
    gen: GeneratorEstimate,
    gen_cuda: bool,
) -> list[Demand]:
    def ask(res) -> dict[str, float]:
        return {"CPU": res.num_cpus, "GPU": res.num_gpus, **res.resources}

    learner_host = learner.host_bytes / GB + (CUDA_PROCESS_HOST_GB if learner_cuda else learner.device_bytes / GB)
    gen_host = CUDA_PROCESS_HOST_GB if gen_cuda else gen.replica_bytes / GB
    return (
        [Demand("driver", 0, {}, DRIVER_HOST_GB)]
        + [Demand("generator", i, ask(cluster.generator), gen_host) for i in range(replicas)]
        + [Demand("learner", r, ask(cluster.learner), learner_host) for r in range(world)]
        + [Demand("coordinator", 0, ask(cluster.coordinator), 0.5)]
        + [Demand("env", i, ask(cluster.env_actor), ENV_ACTOR_HOST_GB) for i in range(cluster.env_actors)]
    )


def target_nodes(
    cluster: ClusterConfig, query: bool, asks_gpus: bool, learner_ranks: int = 1, replicas: int = 1
) -> tuple[list | None, str, list[str]]:
    """(nodes or None when unknown, where they came from, notes). A local start's logical CPUs count
    every learner rank and replica, as ``seal train``'s own start does (seal/runtime/placement.py)."""
    hw = cluster.hardware
    declared = (
        ""
        if hw is None
        else (
            f"cluster.hardware: {hw.nodes} node{'s' * (hw.nodes > 1)} x ({hw.gpus_per_node} GPUs of "
            f"{hw.gpu_gb:g} GB, {hw.cpus_per_node} CPUs, {hw.memory_gb:g} GB host memory)"
        )
    )
    if cluster.address and query:
        try:
            nodes = nodes_from_ray(plan_layout.query_cluster(cluster.address), hw.gpu_gb if hw else None)
            return nodes, f"the running cluster at {cluster.address} ({len(nodes)} nodes)", []
        except RuntimeError as exc:
            if hw is None:
                return None, "unknown", [f"{exc}: placement not checked (no cluster.hardware either)"]
            return hardware_nodes(hw), declared, [f"no running cluster to check ({exc}): planned for cluster.hardware"]
    if hw is not None:
        return hardware_nodes(hw), declared, []
    if cluster.address:
        return (
            None,
            "unknown",
            [f"cluster.address={cluster.address} and no cluster.hardware: placement checked by `seal plan` only"],
        )
    gpus = None
    if asks_gpus:
        gpus = local_gpu_count()
    cpus = cluster.local_cpus(learner_ranks, replicas)
    return (
        hardware_nodes(local_machine(gpus, cpus)),
        f"this machine (a local Ray start: {cpus} logical CPUs for {len(os.sched_getaffinity(0))} cores)",
        [],
    )


# ----------------------------------------------------------------------------- the plan
def build_plan(cfg, query: bool = True, settings: Settings | None = None) -> Plan:
    """``settings``: the typed groups of ``cfg`` when the caller has built them (None: built here)."""
    s = settings or Settings.of(cfg)
    config, source = model_config(s.model)
    m = ModelSpec.from_config(config, Path(source).parent.name)
    cluster: ClusterConfig = instantiate(cfg.cluster)
    ls, gs = learner_setup(cfg, s), generator_setup(s.generator)
    gs = with_adapter_slots(gs, s.learner.cfg.lora, s.trainer.reference_logprobs == "generator", s.generator.max_loras)
    replicas = s.generator.replicas
    asks_gpus = (
        ls.device == "cuda"
        or gs.device == "cuda"
        or any(getattr(cluster, a).num_gpus for a in ("generator", "learner", "env_actor", "coordinator"))
    )
    nodes, where, notes = target_nodes(cluster, query, asks_gpus, ls.world_size, replicas)
    gpu_gb = next((n.gpu_gb for n in nodes or [] if n.gpu_gb), None)
    gen_est = generator_memory(m, gs, gpu_gb * GB if gpu_gb else None)
    lest = learner_memory(m, ls)
    cap = None
    if ls.device == "cuda" and gpu_gb:
        cap = gpu_gb * min(cluster.learner.num_gpus, 1.0)
    plan = Plan(m, source, ls, lest, cap, gs, gen_est, replicas, where, None, notes=notes)
    plan.io = io_bounds(m, ls, s.learner.timeout_s, s.trainer.storage_min_mb_s)
    barrier = closing_barrier_problem(m, ls, s.learner.timeout_s, s.trainer.storage_min_mb_s)
    if barrier and s.trainer.checkpoint_every:
        plan.problems.append(barrier)
    if nodes is not None:
        plan.layout = place(
            demands(cluster, replicas, ls.world_size, lest, ls.device == "cuda", gen_est, gs.device == "cuda"),
            nodes,
            cluster.spread_env_actors,
            check_custom=where.startswith("the running cluster"),
        )
        if gpu_gb:
            _share_gpus(plan, gpu_gb)
    _check_learner(plan, cluster)
    _check_generator(plan, cluster, cfg, gpu_gb)
    plan.problems += group_problems(s, cluster)  # the collective groups' members on their backend's devices
    if plan.layout is not None:
        plan.problems += layout_problems(plan.layout)
        idle = sum(n.free.get("GPU", 0.0) for n in plan.layout.nodes)
        if idle >= 1 and not plan.layout.unplaced:
            plan.notes.append(
                f"{idle:g} GPUs left idle"
                + (" (generator.replicas, issue 14, would take them)" if gs.device == "cuda" else "")
            )
    return plan


def _share_gpus(plan: Plan, gpu_gb: float) -> None:
    """GPUs that fractional asks share (seal/estimate/shared_gpus.py): a learner rank's capacity is the
    GPU less its co-tenants' memory; a shared GPU without a learner rank is checked here."""
    assert plan.layout is not None
    gs = plan.generator
    memory = {
        "learner": (plan.learner_est.device_bytes / GB, "estimated") if plan.learner.device == "cuda" else (None, ""),
        "generator": (
            plan.generator_est.reserved_per_gpu / GB,
            f"gpu_memory_utilization {gs.gpu_memory_utilization:g} x {gpu_gb:g} GB",
        )
        if gs.device == "cuda"
        else (None, ""),
    }
    placed = [
        (n.name, n.capacity.get("GPU", 0.0), [(d.role, d.index, d.resources) for d in n.placed])
        for n in plan.layout.nodes
    ]
    plan.shared_gpus = shared_gpus(placed, memory)
    room = learner_room_gb(plan.shared_gpus, gpu_gb)
    if room is not None:
        plan.learner_capacity_gb = round(room[0], 2)
        plan.learner_capacity_note = f"{gpu_gb:g} GB less what shares its GPU: " + ", ".join(
            t.describe() for t in room[1]
        )
    plan.problems += overcommitted(plan.shared_gpus, gpu_gb)


def _check_learner(plan: Plan, cluster: ClusterConfig) -> None:
    ls = plan.learner
    if ls.device == "cuda" and cluster.learner.num_gpus <= 0:
        plan.problems.append("learner.cfg.device=cuda but cluster.learner.num_gpus=0 (each rank needs a GPU)")
        return
    if ls.device != "cuda":
        return
    if plan.learner_capacity_gb is None:
        plan.notes.append("GPU memory unknown (set cluster.hardware.gpu_gb): learner memory not checked")
        return
    need = plan.learner_est.device_bytes / GB
    if need <= plan.learner_capacity_gb:
        return
    plan.problems.append(
        f"the learner needs {need:.1f} GB per rank ({ls.describe()}) on {plan.learner_capacity_gb:g} GB"
    )
    plan.suggestions += learner_alternatives(plan.model, ls, plan.learner_capacity_gb)


def learner_alternatives(m: ModelSpec, ls: LearnerSetup, cap_gb: float, limit: int = 3) -> list[str]:
    """Overrides that would make one rank fit in ``cap_gb`` with 5% to spare (the estimate is
    an estimate), each with its figure."""

    def gb(s: LearnerSetup) -> float:
        return learner_memory(m, s).device_bytes / GB

    cap_gb *= 0.95

    out: list[str] = []
    z3 = replace(ls, backend="deepspeed", zero_stage=3)
    world = smallest_fitting(
        powers_of_two(max(2, ls.world_size + (ls.stage == 3))), lambda n: gb(replace(z3, world_size=n)) <= cap_gb
    )
    if world is not None:
        head = "" if ls.stage == 3 else "learner=zero3 "
        out.append(
            f"{head}learner.world_size={world} ({gb(replace(z3, world_size=world)):.1f} GB per rank on {world} GPUs)"
        )
    off = replace(ls, backend="deepspeed", zero_stage=max(ls.stage, 2), offload_optimizer=True)
    head = "" if ls.stage >= 2 else "learner=zero2 "
    if gb(off) <= cap_gb:
        out.append(
            f"{head}learner.cfg.offload_optimizer=true ({gb(off):.1f} GB per rank, {learner_memory(m, off).host_bytes / GB:.0f} GB host)"
        )
    else:
        both = replace(off, zero_stage=3, offload_param=True)
        if gb(both) <= cap_gb:
            out.append(
                f"{'' if ls.stage == 3 else 'learner=zero3 '}learner.cfg.offload_optimizer=true learner.cfg.offload_param=true "
                f"({gb(both):.1f} GB per rank, {learner_memory(m, both).host_bytes / GB:.0f} GB host)"
            )
    if ls.micro_batch_size > 1 and gb(replace(ls, micro_batch_size=1)) <= cap_gb:
        out.append(f"learner.cfg.micro_batch_size=1 ({gb(replace(ls, micro_batch_size=1)):.1f} GB per rank)")
    if not ls.gradient_checkpointing and gb(replace(ls, gradient_checkpointing=True)) <= cap_gb:
        out.append(
            f"learner.cfg.gradient_checkpointing=true ({gb(replace(ls, gradient_checkpointing=True)):.1f} GB per rank)"
        )
    return out[:limit]


def _check_generator(plan: Plan, cluster: ClusterConfig, cfg, gpu_gb: float | None) -> None:
    gs, m, est = plan.generator, plan.model, plan.generator_est
    if gs.device != "cuda":
        if est.sequences < 1:
            plan.problems.append(
                f"the generator's KV cache (generator.cpu_kv_cache_gb={gs.cpu_kv_cache_gb:g}) holds no sequence of "
                f"{gs.max_model_len} tokens ({est.kv_per_token * gs.max_model_len / GB:.2f} GB each)"
            )
        return
    tp = gs.tensor_parallel_size
    if not tp_divides(m, tp):
        plan.problems.append(
            f"generator.tensor_parallel_size={tp} does not split {m.heads} attention / {m.kv_heads} KV heads"
        )
    # A fraction of one GPU is a replica of TP 1 sharing it (its memory: seal/estimate/shared_gpus.py).
    if cluster.generator.num_gpus < tp and not (tp == 1 and 0 < cluster.generator.num_gpus < 1):
        plan.problems.append(
            f"generator.tensor_parallel_size={tp} but cluster.generator.num_gpus={cluster.generator.num_gpus:g}"
        )
    if gpu_gb is None:
        plan.notes.append("GPU memory unknown (set cluster.hardware.gpu_gb): generator KV cache not estimated")
        return
    if est.sequences >= 1:
        if est.sequences < int(cfg.n):
            plan.notes.append(
                f"one replica holds {est.sequences} sequences of {gs.max_model_len} tokens, fewer than a group (n={cfg.n})"
            )
        return
    plan.problems.append(
        f"the generator's {est.weights_per_gpu / GB:.1f} GB of weights per GPU leave KV for no sequence of "
        f"{gs.max_model_len} tokens in {gs.gpu_memory_utilization:g} x {gpu_gb:g} GB"
    )
    for t in powers_of_two(tp * 2):
        if tp_divides(m, t) and generator_memory(m, replace(gs, tensor_parallel_size=t), gpu_gb * GB).sequences >= 1:
            plan.suggestions.append(f"generator.tensor_parallel_size={t} cluster.generator.num_gpus={t}")
            break


def run_io_bounds(cfg, settings: Settings | None = None) -> IoBounds | None:
    """The learner group's checkpoint and snapshot bounds for a run of ``cfg``; None when the model's
    config.json cannot be read here (every call then has learner.timeout_s, as before)."""
    s = settings or Settings.of(cfg)
    try:
        config, source = model_config(s.model)
        m = ModelSpec.from_config(config, Path(source).parent.name)
        return io_bounds(m, learner_setup(cfg, s), s.learner.timeout_s, s.trainer.storage_min_mb_s)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_fits(cfg, settings: Settings | None = None) -> None:
    """`seal train`'s preflight: ValueError with the one-line verdict when the plan clearly cannot fit.
    Nothing is refused when the model's config.json cannot be read or is not a decoder-only
    HF config the estimate knows (the model check and the learner say what they think of it); a
    collective group its members' devices cannot form is refused whatever the model."""
    s = settings or Settings.of(cfg)
    problems = group_problems(s, instantiate(cfg.cluster))
    if problems:
        raise ValueError("; ".join(problems))
    try:
        plan = build_plan(cfg, query=False, settings=s)
    except (OSError, ValueError, KeyError, TypeError):  # json.JSONDecodeError is a ValueError
        return
    if not plan.fits:
        raise ValueError(f"seal plan: {plan.verdict()} (`seal plan` with the same overrides shows the whole plan)")
