"""What `seal rehearse` found, judged and written out: pure functions of plain records, so a test
can feed them a placement that differs from the plan (seal/commands/rehearse.py gathers the records).

The placement check compares node *shapes*, not node names: the rehearsal's nodes are not the
cluster's, and `seal plan`'s nodes are interchangeable, so the question is whether the multiset
of (learner ranks, generator replicas) per node is the one the plan states. A learner spread
over more nodes than the plan packs it on is named first: ZeRO's gathers would cross nodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPORT_JSON = "rehearsal.json"
REPORT_TEXT = "rehearsal.txt"


@dataclass(frozen=True)
class Landing:
    """Where one learner rank or generator replica runs."""

    role: str  # learner | generator
    name: str  # "rank 0" | the replica's actor name
    node_id: str
    ip: str
    gpus: int = 0  # logical GPUs it holds (cluster.learner / cluster.generator num_gpus)


@dataclass(frozen=True)
class NodeShape:
    """What one node holds: learner ranks and generator replicas."""

    learners: int
    generators: int

    def text(self) -> str:
        parts = [
            f"learner x{self.learners}" if self.learners else "",
            f"generator x{self.generators}" if self.generators else "",
        ]
        return " + ".join(p for p in parts if p) or "nothing"


def plan_shapes(layout) -> list[NodeShape]:
    """Per node of `seal plan`'s layout (seal/plan_layout.Layout): its learner ranks and replicas."""
    return [
        NodeShape(sum(d.role == "learner" for d in n.placed), sum(d.role == "generator" for d in n.placed))
        for n in layout.nodes
    ]


def landed_shapes(landings: Sequence[Landing], node_ids: Sequence[str]) -> dict[str, NodeShape]:
    """node id -> what landed there, for every node of the cluster (empty ones too)."""
    out = {}
    for node in list(node_ids) + [x.node_id for x in landings if x.node_id not in node_ids]:
        here = [x for x in landings if x.node_id == node]
        out[node] = NodeShape(sum(x.role == "learner" for x in here), sum(x.role == "generator" for x in here))
    return out


def _counts(shapes: Sequence[NodeShape], role: str) -> list[int]:
    return sorted((getattr(s, role) for s in shapes if getattr(s, role)), reverse=True)


def compare_placement(plan: Sequence[NodeShape], landings: Sequence[Landing], node_ids: Sequence[str]) -> list[str]:
    """One line per way the rehearsal's placement differs from the plan's (empty: it matches)."""
    got = landed_shapes(landings, node_ids)
    problems = []
    for role, what in (("learners", "learner ranks"), ("generators", "generator replicas")):
        want_n, got_n = sum(getattr(s, role) for s in plan), sum(getattr(s, role) for s in got.values())
        if want_n != got_n:
            problems.append(f"{got_n} {what} placed where seal plan places {want_n}")
    want_l, got_l = _counts(plan, "learners"), _counts(list(got.values()), "learners")
    if len(got_l) > len(want_l):
        ranks = {
            node: [x.name.split()[-1] for x in landings if x.role == "learner" and x.node_id == node] for node in got
        }
        where = "; ".join(f"ranks {','.join(r)} on node {node[:8]}" for node, r in ranks.items() if r)
        problems.append(
            f"learner split over {len(got_l)} nodes ({' + '.join(map(str, got_l))} ranks: {where}) where seal plan "
            f"places it on {len(want_l)} ({' + '.join(map(str, want_l))}): ZeRO's gathers would cross nodes"
        )
    want_g, got_g = _counts(plan, "generators"), _counts(list(got.values()), "generators")
    if want_g != got_g and sum(want_g) == sum(got_g):
        problems.append(
            f"generator replicas per node {' + '.join(map(str, got_g))} where seal plan places "
            f"{' + '.join(map(str, want_g))}"
        )
    if not problems and sorted(got.values(), key=_key) != sorted(plan, key=_key):
        problems.append(
            "placement differs from seal plan: nodes hold "
            + " | ".join(s.text() for s in sorted(got.values(), key=_key))
            + " where the plan has "
            + " | ".join(s.text() for s in sorted(plan, key=_key))
        )
    return problems


def _key(s: NodeShape) -> tuple[int, int]:
    return (-s.learners, -s.generators)


# ------------------------------------------------------------------------------ checkpoints
_RANK_FILE = re.compile(r"(?:zero_pp_rank_|rng_rank|_rank_)(\d+)")


def file_rank(name: str) -> int | None:
    """The learner rank a checkpoint file belongs to (DeepSpeed's zero_pp_rank_R_..., rng_rankR.pt,
    rng.pt for rank 0); None for files of the whole checkpoint (learner.json, latest)."""
    if name == "rng.pt":
        return 0
    m = _RANK_FILE.search(name)
    return int(m[1]) if m else None


def checkpoint_shards(ckpt: Path) -> dict[str, Any]:
    """The newest DeepSpeed tag under ``ckpt`` (checkpoints/latest): files per rank with sizes."""
    if not ckpt.is_dir():
        return {"dir": str(ckpt), "tag": None, "ranks": {}, "shared": []}
    tags = sorted((p for p in ckpt.iterdir() if p.is_dir() and re.fullmatch(r"step\d+", p.name)), key=lambda p: p.name)
    files = [p for p in ckpt.iterdir() if p.is_file()] + (list(tags[-1].iterdir()) if tags else [])
    ranks: dict[str, list[dict[str, Any]]] = {}
    shared = []
    for p in sorted(files, key=lambda p: p.name):
        rank = file_rank(p.name)
        entry = {"file": str(p.relative_to(ckpt)), "mb": round(p.stat().st_size / 2**20, 3)}
        if rank is None:
            shared.append(entry)
        else:
            ranks.setdefault(str(rank), []).append(entry)
    return {
        "dir": str(ckpt),
        "tag": tags[-1].name if tags else None,
        "tags": [t.name for t in tags],
        "ranks": dict(sorted(ranks.items(), key=lambda kv: int(kv[0]))),
        "shared": shared,
    }


def checkpoint_problems(
    shards: Mapping[str, Any], world_size: int, deepspeed: bool, zero_shards: bool = True
) -> list[str]:
    """Ranks without their part of the newest checkpoint. ``zero_shards``: DeepSpeed partitions the
    optimizer state (ZeRO shards per rank); False at stage 0, which ZeRO-1/2 on one rank runs
    (learner/ds_config.py effective_zero_stage), where rank 0's model states file holds it."""
    ranks = shards.get("ranks", {})
    if deepspeed and shards.get("tag") is None:
        return [f"no DeepSpeed checkpoint tag under {shards['dir']}"]
    part = "zero_pp_rank" if zero_shards else "mp_rank_"
    missing = [
        r for r in range(world_size) if not any(part in f["file"] or not deepspeed for f in ranks.get(str(r), []))
    ]
    return [f"learner rank {r} wrote no checkpoint shard under {shards['dir']}" for r in missing]


# ------------------------------------------------------------------------------ the report
@dataclass
class Report:
    recipe: str
    command: str  # the `seal train` this rehearsal ran
    cluster: dict[str, Any]
    plan: list[dict[str, Any]] = field(default_factory=list)  # seal plan's nodes: {"name", "learner", "generator"}
    landings: list[Landing] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # replica -> versions confirmed
    checkpoints: dict[str, Any] = field(default_factory=dict)
    snapshot: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    peak_rss_gb: float | None = None
    run_dir: str = ""
    failures: list[str] = field(default_factory=list)
    not_rehearsed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def verdict(self) -> str:
        """The one line a failed rehearsal ends with."""
        return f"rehearsal of {self.recipe} failed: " + "; ".join(self.failures)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


def report_text(r: Report) -> str:
    nodes = [n["node_id"] for n in r.cluster.get("nodes", [])]
    lines = (
        [
            f"seal rehearse: {r.recipe} on {r.cluster.get('kind', '?')} ({len(nodes)} node{'s' * (len(nodes) != 1)})",
            f"ran: {r.command}",
        ]
        + ([f"Ray logs: {r.cluster['ray_logs']}"] if r.cluster.get("ray_logs") else [])
        + [""]
    )
    lines.append("placement (rehearsal node: what landed | seal plan):")
    shapes = landed_shapes(r.landings, nodes)
    for i, node in enumerate(nodes):
        here = [x for x in r.landings if x.node_id == node]
        names = (
            ", ".join(
                f"learner {x.name} ({x.gpus:g} GPU)"
                if x.role == "learner"
                else f"replica {x.name.rsplit('-', 1)[-1]} ({x.gpus:g} GPUs)"
                for x in here
            )
            or "nothing"
        )
        ip = next((n["ip"] for n in r.cluster["nodes"] if n["node_id"] == node), "?")
        lines.append(f"  node {i} ({node[:8]}, {ip}): {names}  [{shapes[node].text()}]")
    if r.plan:
        lines.append(
            "  seal plan: "
            + " | ".join(f"{p['name']}: {NodeShape(p['learner'], p['generator']).text()}" for p in r.plan)
        )
    lines.append("")
    lines.append("collective groups:")
    for g in r.groups:
        lines.append(
            f"  {g['name']}: world size {g['world_size']}, {g['backend']}"
            + (f"; {g['detail']}" if g.get("detail") else "")
        )
    if not r.groups:
        lines.append("  none formed")
    lines.append("")
    lines.append("weights per replica (version: confirmed, canary max |logprob diff|):")
    for name, versions in r.weights.items():
        cells = ", ".join(
            f"v{v['version']}: "
            + ("ok" if v.get("confirmed") else "NOT confirmed")
            + (f" {v['canary_diff']:.2g}" if v.get("canary_diff") is not None else " no canary")
            for v in versions
        )
        lines.append(f"  {name}: {cells or 'no update'}")
    lines.append("")
    ck = r.checkpoints
    if ck:
        lines.append(f"checkpoint {ck.get('tag')} under {ck.get('dir')}:")
        for rank, files in ck.get("ranks", {}).items():
            lines.append(f"  rank {rank}: " + ", ".join(f"{Path(f['file']).name} ({f['mb']:.1f} MB)" for f in files))
    if r.snapshot:
        lines.append(
            f"snapshot {r.snapshot.get('name')}: {r.snapshot.get('weights')} ({r.snapshot.get('files', 0)} files)"
        )
    lines.append("")
    lines.append(
        "steps: "
        + (
            ", ".join(f"{s['step']}: {s['step_s']:.1f} s (learner {s.get('learner_s') or 0:.1f} s)" for s in r.steps)
            or "none"
        )
    )
    mem = f", peak memory {r.peak_rss_gb:.1f} GB (Ray processes' RSS)" if r.peak_rss_gb is not None else ""
    lines.append(f"wall time {r.wall_s:.0f} s{mem}")
    lines.append("")
    lines.append("not rehearsed here:")
    lines += [f"  - {x}" for x in r.not_rehearsed]
    lines.append("")
    lines.append("rehearsal: passed" if r.ok else "rehearsal: FAILED")
    lines += [f"  {x}" for x in r.failures]
    return "\n".join(lines)


def write_report(r: Report, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / REPORT_JSON).write_text(json.dumps(r.to_json(), indent=2, default=str))
    (run_dir / REPORT_TEXT).write_text(report_text(r) + "\n")
