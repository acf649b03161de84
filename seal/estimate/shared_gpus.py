"""GPUs that several actors share through fractional Ray asks (`seal plan`), e.g. one learner rank and
one vLLM replica each asking ``num_gpus: 0.5`` of a single GPU (configs/recipe/qwen7b_lora_1x1.yaml).

Ray's fraction is a placement token only: it says who may land on a GPU, not how much of its memory
each may take. What each tenant takes is its own: a learner rank what seal/estimate/memory.py
estimates, a vLLM replica ``gpu_memory_utilization`` of the whole GPU (vLLM's share is of the
device, whoever else is on it; at start it refuses a GPU with less than that free). So a shared GPU
fits when its tenants' memory adds up within it, whatever their fractions, and a learner rank's room
on it is the GPU less the others' (not the GPU times its fraction). Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tenant:
    """One actor on a shared GPU: ``share`` its Ray fraction, ``gb`` the device memory it takes there
    (None: not known, e.g. an env actor given a fraction), ``how`` what ``gb`` is."""

    role: str  # learner | generator | coordinator | env
    index: int
    share: float
    gb: float | None
    how: str = ""

    @property
    def name(self) -> str:
        return {"learner": "learner rank", "generator": "generator replica"}.get(
            self.role, self.role
        ) + f" {self.index}"

    def describe(self) -> str:
        return (
            f"{self.name} ({self.gb:.1f} GB{': ' + self.how if self.how else ''})" if self.gb is not None else self.name
        )


@dataclass
class SharedGpu:
    node: str
    index: int  # the GPU's index among the node's GPUs that fractions share
    tenants: list[Tenant] = field(default_factory=list)

    @property
    def share(self) -> float:
        return sum(t.share for t in self.tenants)

    def memory_gb(self) -> float:
        return sum(t.gb or 0.0 for t in self.tenants)

    def others_gb(self, tenant: Tenant) -> float:
        return sum(t.gb or 0.0 for t in self.tenants if t is not tenant)


def pack_fractions(node: str, free_gpus: int, tenants: Sequence[Tenant]) -> list[SharedGpu]:
    """The GPUs of ``node`` that fractional asks share, in the order the actors were placed: each on
    the first GPU with room for its fraction (Ray hands a fraction out of an instance already split
    before it splits a whole one, so two halves on a one-GPU node share it). ``free_gpus``: the
    node's GPUs left after whole-GPU asks. Tenants past the node's GPUs are left out (the placement
    reports them)."""
    gpus: list[SharedGpu] = []
    for t in tenants:
        gpu = next((g for g in gpus if g.share + t.share <= 1.0 + 1e-9), None)
        if gpu is None and len(gpus) < free_gpus:
            gpu = SharedGpu(node, len(gpus))
            gpus.append(gpu)
        if gpu is not None:
            gpu.tenants.append(t)
    return [g for g in gpus if len(g.tenants) > 1]


def shared_gpus(
    nodes: Sequence[tuple[str, float, Sequence[tuple[str, int, Mapping[str, float]]]]],
    memory_gb: Mapping[str, tuple[float | None, str]],
) -> list[SharedGpu]:
    """Every GPU two or more actors share. ``nodes``: (name, GPUs, the placed actors as (role, index,
    Ray resources) in placement order); ``memory_gb``: per role, the GB an actor of it takes on its
    GPU and how that was reckoned."""
    out: list[SharedGpu] = []
    for name, gpus, placed in nodes:
        whole = sum(int(r.get("GPU", 0.0)) for _, _, r in placed if r.get("GPU", 0.0) >= 1)
        fractions = [
            Tenant(role, index, float(r["GPU"]), *memory_gb.get(role, (None, "")))
            for role, index, r in placed
            if 0 < r.get("GPU", 0.0) < 1
        ]
        out += pack_fractions(name, int(gpus) - whole, fractions)
    return out


def learner_room_gb(gpus: Sequence[SharedGpu], gpu_gb: float) -> tuple[float, list[Tenant]] | None:
    """The least GPU memory a learner rank has beside the others on a GPU it shares (the GPU less
    their memory) and those others; None when no rank shares one."""
    rooms = [
        (gpu_gb - g.others_gb(t), [o for o in g.tenants if o is not t])
        for g in gpus
        for t in g.tenants
        if t.role == "learner"
    ]
    return min(rooms, key=lambda r: r[0]) if rooms else None


def overcommitted(gpus: Sequence[SharedGpu], gpu_gb: float) -> list[str]:
    """One line per shared GPU without a learner rank whose tenants take more than it has (a learner
    rank's GPU is checked against the learner's estimate, with its room as capacity)."""
    return [
        f"GPU {g.index} of {g.node} is shared by {' and '.join(t.describe() for t in g.tenants)}: "
        f"{g.memory_gb():.1f} GB of {gpu_gb:g} GB"
        for g in gpus
        if g.memory_gb() > gpu_gb and not any(t.role == "learner" for t in g.tenants)
    ]


def describe(g: SharedGpu, gpu_gb: float) -> str:
    """The plan table's line for a shared GPU."""
    return f"GPU {g.index} of {g.node} shared: {' + '.join(t.describe() for t in g.tenants)} = {g.memory_gb():.1f} of {gpu_gb:g} GB"
