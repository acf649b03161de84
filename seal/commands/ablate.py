"""`seal ablate --set a,b --out DIR [overrides]`: the paper's ablations side by side.

Each name is ``full`` (SEAL as configured) or a file configs/ablation/<name>.yaml.
Every run gets the same hydra overrides, so the same seed, split, task limit
and budget (steps x groups x rollouts); that is checked on the composed
configs before anything runs, since an ablation file that changed the budget
would make the comparison meaningless. Each run trains with `seal train` into
DIR/<name> and is evaluated with `seal evaluate`, each in its own process (a
pipeline owns Ray and a vLLM engine; a fresh process frees both). A run whose
training already finished with the same arguments is not trained again, and
evaluation is incremental, so an interrupted ablation resumes.
With --seeds each ablation trains once per seed (DIR/<name>/seed<k>). Besides the
SEAGym views (skipped with --no-views), the table holds every run's closing frozen
evaluation and each ablation's final snapshot against the first's, paired over
(seed, task) (seal/commands/ablate_final.py), and the learning curves: held-in success at
every frozen snapshot per arm with intervals, step by step against the first arm, and what
the interface evolution did (seal/commands/ablate_curves.py). Writes DIR/ablation.json,
DIR/ablation.md, DIR/curves.json, DIR/curves.md and DIR/curves.png (success vs step).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from omegaconf import OmegaConf

from seal.commands.ablate_curves import write_curves
from seal.commands.ablate_final import final_markdown, final_table, seed_dirs
from seal.config import compose, config_dir
from seal.console import Paced
from seal.errors import CliError

FULL = "full"
SAME = (
    "seed",
    "split",
    "limit",
    "n",
    "trainer.steps",
    "trainer.groups_per_step",
    "trainer.mode",
    "env._target_",
    "model.path",
    "evaluation.validation_size",
    "evaluation.heldout_categories",
)


def ablation_names() -> list[str]:
    return sorted(p.stem for p in (config_dir() / "ablation").glob("*.yaml"))


def ablation_override(name: str) -> list[str]:
    """The override that selects an ablation: ``ablation=x`` when the root
    defaults list has an ablation slot, ``+ablation=x`` when it does not."""
    if name == FULL:
        return []
    try:
        compose([f"ablation={name}"])
        return [f"ablation={name}"]
    except ValueError:
        return [f"+ablation={name}"]


def _compose_all(names: list[str], shared: list[str]) -> dict[str, Any]:
    def get(cfg, key: str) -> Any:
        value = OmegaConf.select(cfg, key)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    cfgs = {n: compose(shared + ablation_override(n)) for n in names}
    budget = {n: {k: get(c, k) for k in SAME} for n, c in cfgs.items()}
    first = next(iter(budget.values()))
    for n, b in budget.items():
        diff = {k: (first[k], b[k]) for k in SAME if b[k] != first[k]}
        if diff:
            raise ValueError(
                f"ablation {n!r} changes the shared setting(s) {diff}: compare runs with the same seed, split and budget"
            )
    return {
        "settings": first,
        "changes": {n: OmegaConf.select(c, "ablation.changes") or "none (SEAL as configured)" for n, c in cfgs.items()},
    }


def _seal(argv: list[str], log: Path, capture: bool = False) -> str:
    cmd = [sys.executable, "-m", "seal.commands.cli", *argv]
    print("$ seal " + " ".join(argv), flush=True)
    with open(log, "a") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE if capture else err, stderr=err, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`seal {' '.join(argv)}` failed (exit {proc.returncode}); see {log}")
    return proc.stdout if capture else ""


class ChildCommands:
    """`seal ablate`'s progress while its child commands run (their output goes to their logs): a
    line at least every 30 s naming the command, and the time left at the mean pace of the commands
    run so far (seal/console.py's Paced). A training run found finished is skipped."""

    def __init__(self, total: int, *, clock=None, stream: TextIO | None = None, every: float = 30.0) -> None:
        self.paced = Paced(total, "commands", clock=clock, stream=stream, every=every)
        self.heartbeat = self.paced.heartbeat

    def skip(self) -> None:
        self.paced.skip()

    def run(self, argv: list[str], log: Path, capture: bool = False) -> str:
        self.paced.starts(f"ablate: seal {' '.join(argv[:2])} (its output: {log})")
        try:
            return _seal(argv, log, capture)
        finally:
            self.paced.ends()


def row(name: str, changes: str, summary: dict[str, Any]) -> dict[str, Any]:
    """One table row: the final snapshot on every view, beside the best-validation one."""
    final, best = summary["final"], summary["best_validation"]
    views = summary["views"]
    success = summary["success"]

    def at(snapshot: str | None, role: str) -> float | None:
        return None if snapshot is None else success.get(snapshot, {}).get(views[role], {}).get("overall")

    drops = [v for v in summary["forgetting"].values() if v is not None]
    cost = summary["cost"][final]
    return {
        "ablation": name,
        "changes": changes,
        "final": final,
        **{f"final_{role}": at(final, role) for role in ("validation", "id", "ood", "replay")},
        "best_validation": best,
        "best_validation_id": at(best, "id"),
        "uvg_base": summary["uvg_base"].get(final),
        "id_gain": summary["id_gain"],
        "ood_gain": summary["ood_gain"],
        "forgetting_total": sum(drops) if drops else None,
        "train_wall_s": cost["train_wall_s_total"],
        "update_tokens": summary["snapshot_info"][final]["update_tokens"],
    }


COLUMNS = (
    ("ablation", "ablation"),
    ("final_validation", "validation %"),
    ("final_id", "ID %"),
    ("final_ood", "OOD %"),
    ("final_replay", "replay %"),
    ("best_validation", "best val."),
    ("best_validation_id", "ID % at best val."),
    ("uvg_base", "UVG_base pp"),
    ("id_gain", "ID gain pp"),
    ("ood_gain", "OOD gain pp"),
    ("forgetting_total", "forgetting pp"),
    ("train_wall_s", "train s"),
    ("update_tokens", "update tokens"),
)


def markdown(rows: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    def cell(key: str, value: Any) -> str:
        if value is None:
            return "n/a"
        if key.startswith(("final_", "best_validation_")) or key in (
            "uvg_base",
            "id_gain",
            "ood_gain",
            "forgetting_total",
        ):
            return f"{100 * value:.1f}"
        if isinstance(value, float):
            return f"{value:,.1f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    lines = [
        "# Ablations",
        "",
        "Same settings for every run: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "",
        "Success is macro % over categories at the final snapshot (raw interface, greedy); gains and "
        "forgetting in percentage points; the best-validation snapshot is shown beside the final one.",
        "",
        "| " + " | ".join(h for _, h in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cell(k, r[k]) for k, _ in COLUMNS) + " |" for r in rows]
    lines += ["", "Changes:", ""] + [f"- `{r['ablation']}`: {r['changes']}" for r in rows]
    return "\n".join(lines) + "\n"


def _seeds(args, shared: list[str]) -> list[int] | None:
    if not getattr(args, "seeds", None):
        return None
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        raise CliError(f"--seeds takes comma-separated integers, got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise CliError(f"--seeds needs distinct seeds, got {args.seeds!r}")
    if any(o.split("=")[0] == "seed" for o in shared):
        raise CliError("give the seeds with --seeds, not as a seed= override")
    return seeds


def _run_all(args, names, seeds, shared, plan, out: Path, calls: ChildCommands, rows, summaries, runs) -> None:
    """Train (unless already trained with the same arguments) and evaluate every ablation and seed,
    filling ``rows``, ``summaries`` and ``runs``."""
    for name in names:
        runs[name] = seed_dirs(out, name, seeds)
        for seed, run_dir in runs[name].items():
            train = [
                *shared,
                *([f"seed={seed}"] if seed is not None else []),
                *ablation_override(name),
                f"run_dir={run_dir}",
            ]
            tag = name if seed is None else f"{name}.seed{seed}"
            marker = out / f".{tag}.trained.json"
            if not (marker.is_file() and json.loads(marker.read_text()) == train):
                if (run_dir / "run.json").exists():
                    raise CliError(
                        f"{run_dir} holds a run made with other arguments (or unfinished): move it away first"
                    )
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                calls.run(["train", *train], out / f"{tag}.train.log")
                marker.write_text(json.dumps(train))
            else:
                calls.skip()  # trained already with the same arguments
            if args.no_views:
                continue
            evaluate = ["evaluate", str(run_dir), "--json"]
            evaluate += ["--limit", str(args.limit)] if args.limit is not None else []
            evaluate += ["--views", args.views] if args.views else []
            summary = json.loads(
                calls.run(evaluate, out / f"{tag}.evaluate.log", capture=True).strip().splitlines()[-1]
            )
            summaries[tag] = str(run_dir / "evaluation" / "summary.json")
            rows.append({**row(name, plan["changes"][name], summary), "seed": seed})


def ablate(args) -> int:
    names = [n for n in args.ablations.split(",") if n]
    known = ablation_names()
    if unknown := [n for n in names if n != FULL and n not in known]:
        raise CliError(f"unknown ablations {unknown}; known: {[FULL, *known]}")
    if len(set(names)) != len(names) or not names:
        raise CliError(f"--set needs distinct names, got {names}")
    shared = list(args.overrides)
    if bad := [o for o in shared if o.lstrip("+~").split("=")[0] in ("run_dir", "resume", "ablation")]:
        raise CliError(f"seal ablate sets these itself: {bad}")
    seeds = _seeds(args, shared)
    plan = _compose_all(names, shared + ([f"seed={seeds[0]}"] if seeds else []))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, summaries, runs = [], {}, {}
    per_run = 1 if args.no_views else 2  # seal train, then seal evaluate
    calls = ChildCommands(len(names) * len(seeds or [None]) * per_run)
    calls.heartbeat.start()
    try:
        _run_all(args, names, seeds, shared, plan, out, calls, rows, summaries, runs)
    finally:
        calls.heartbeat.stop()
    final = final_table(runs)
    _, curves_text = write_curves(runs, out)
    settings = {**plan["settings"], **({"seed": ",".join(map(str, seeds))} if seeds else {})}
    table = (
        (
            markdown(rows, settings)
            if rows
            else "# Ablations\n\nSame settings for every run: "
            + ", ".join(f"{k}={v}" for k, v in settings.items())
            + "\n"
        )
        + "\n"
        + final_markdown(final)
        + "\n"
        + curves_text
    )
    (out / "ablation.md").write_text(table)
    (out / "ablation.json").write_text(
        json.dumps(
            {
                "settings": settings,
                "overrides": shared,
                "seeds": seeds,
                "rows": rows,
                "summaries": summaries,
                "final": final,
            },
            indent=2,
        )
    )
    print(table)
    print(f"wrote {out / 'ablation.md'}, {out / 'ablation.json'} and the curves {out / 'curves.png'}")
    return 0
