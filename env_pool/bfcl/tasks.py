"""BFCL V3 multi-turn tasks, read from the installed bfcl-eval data.

800 tasks in 4 categories (base, miss_func, miss_param, long_context). The
data files are bfcl-eval's ``BFCL_v4_multi_turn_*.json`` (the current copy of
the V3 multi-turn set). We read them with json directly: bfcl-eval's loaders
mutate entries in place and import modules that write into site-packages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from env_pool.bfcl.runtime import package_dir, prepare_import

CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
SPLITS: tuple[str, ...] = ("train", "test", "all")
TASK_PREFIX = "multi_turn_"


@dataclass(frozen=True)
class BfclTask:
    id: str
    category: str
    # One list of messages per user turn; a withheld-function turn is empty.
    questions: tuple[tuple[dict[str, str], ...], ...]
    initial_config: dict[str, Any]
    involved_classes: tuple[str, ...]
    # Tool schemas visible from the first turn.
    functions: tuple[dict[str, Any], ...]
    # miss_func: turn index -> schemas revealed at that turn.
    withheld: dict[int, tuple[dict[str, Any], ...]]
    # Per user turn, the calls a correct agent makes (bfcl-eval call strings).
    ground_truth: tuple[tuple[str, ...], ...]

    @property
    def num_turns(self) -> int:
        return len(self.questions)

    @property
    def long_context(self) -> bool:
        # Same rule as bfcl-eval's checker and inference loop.
        return "long_context" in self.category

    def tools_at_turn(self, turn: int) -> tuple[dict[str, Any], ...]:
        extra = [doc for t, docs in sorted(self.withheld.items()) if t <= turn for doc in docs]
        return self.functions + tuple(extra)


def category_of(task_id: str) -> str:
    """The category in the id (``multi_turn_<category>_<n>``), without loading any task."""
    cat = task_id[len(TASK_PREFIX) :].rsplit("_", 1)[0] if task_id.startswith(TASK_PREFIX) else ""
    if cat not in CATEGORIES:
        raise KeyError(f"not a BFCL V3 multi-turn task id: {task_id!r}")
    return cat


@lru_cache(maxsize=1)
def _function_docs() -> dict[str, tuple[dict[str, Any], ...]]:
    prepare_import()
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    doc_dir = package_dir() / "data" / "multi_turn_func_doc"
    return {cls: tuple(_read_jsonl(doc_dir / name)) for cls, name in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items()}


def _read_jsonl(path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@lru_cache(maxsize=1)
def load_tasks() -> dict[str, BfclTask]:
    """All 800 tasks by id (cached per process; entries are immutable)."""
    data = package_dir() / "data"
    docs = _function_docs()
    tasks: dict[str, BfclTask] = {}
    for cat in CATEGORIES:
        entries = _read_jsonl(data / f"BFCL_v4_multi_turn_{cat}.json")
        answers = {
            a["id"]: a["ground_truth"] for a in _read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{cat}.json")
        }
        for e in entries:
            tasks[e["id"]] = _build_task(e, cat, answers[e["id"]], docs)
    return tasks


def _build_task(entry: dict, cat: str, gt: list[list[str]], docs) -> BfclTask:
    functions = [doc for cls in entry["involved_classes"] for doc in docs[cls]]
    withheld: dict[int, tuple[dict[str, Any], ...]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        taken = []
        for name in names:
            idx = next(i for i, doc in enumerate(functions) if doc["name"] == name)
            taken.append(functions.pop(idx))
        withheld[int(turn)] = tuple(taken)
    if len(gt) != len(entry["question"]):
        raise ValueError(f"{entry['id']}: {len(gt)} ground-truth turns for {len(entry['question'])} user turns")
    return BfclTask(
        id=entry["id"],
        category=cat,
        questions=tuple(tuple(turn) for turn in entry["question"]),
        initial_config=entry.get("initial_config", {}),
        involved_classes=tuple(entry["involved_classes"]),
        functions=tuple(functions),
        withheld=withheld,
        ground_truth=tuple(tuple(turn) for turn in gt),
    )


@lru_cache(maxsize=1)
def _split_file() -> dict[str, Any]:
    text = resources.files("env_pool").joinpath("data/bfcl_400_split.json").read_text(encoding="utf-8")
    return json.loads(text)


def split_ids(split: str) -> list[str]:
    """Task ids of the published 400/400 split (SEAL release), or all 800."""
    if split == "all":
        return sorted(load_tasks(), key=_sort_key)
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return list(_split_file()[split])


def _sort_key(task_id: str) -> tuple[int, int]:
    cat = category_of(task_id)
    return CATEGORIES.index(cat), int(task_id.rsplit("_", 1)[1])


def get_task(task_id: str) -> BfclTask:
    tasks = load_tasks()
    if task_id not in tasks:
        raise KeyError(
            f"unknown BFCL task id {task_id!r} (ids look like multi_turn_base_0 .. multi_turn_long_context_199)"
        )
    return tasks[task_id]
