"""Groups lost and trained twice over a soak's invocations (pure functions over what they recorded).

A driver death or a run-ending fault rewinds the run to its last checkpoint: the learner reloads the
weights of step S and the task stream its position (replay/slots.py SlotPosition), so what steps after
S trained is gone from the model and those slots are played again. The run's lineage is therefore, for
invocation i that resumed at step S_i, its steps in (S_i, S_{i+1}], with S_{n+1} the step of the
checkpoint on disk at the end. Over the lineage every slot below the final low-water mark (and every
``done`` one above it) is trained exactly once, or was given up; a slot trained in two lineage steps
is trained twice, one neither trained nor given up is lost.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_GROUP = re.compile(r"^g(\d+)a(\d+)$")
GIVEN_UP = re.compile(r"\(slot (\d+)\) given up after")
DROPPED = re.compile(r"\(slot (\d+)\): staleness \d+ past trainer\.max_staleness")  # seal/run/progress.py


def slot_of(group_id: str) -> int:
    m = _GROUP.match(group_id)
    if m is None:
        raise ValueError(f"not a group id of the task stream: {group_id!r}")
    return int(m.group(1))


def lineage(records: Iterable[Mapping[str, Any]], starts: Mapping[int, int], final_step: int) -> list[dict]:
    """The step records that stand: invocation i's steps in (starts[i], next start or ``final_step``]."""
    order = sorted(starts)
    upper = {inv: (starts[order[k + 1]] if k + 1 < len(order) else final_step) for k, inv in enumerate(order)}
    kept = [
        r
        for r in records
        if r["invocation"] in starts and starts[r["invocation"]] < r["step"] <= upper[r["invocation"]]
    ]
    return sorted(kept, key=lambda r: r["step"])


def account(
    records: Sequence[Mapping[str, Any]],
    starts: Mapping[int, int],
    final_step: int,
    low: int,
    done: Iterable[int],
    given_up: Iterable[int],
    dropped: Iterable[int] = (),
) -> dict[str, Any]:
    """Trained, trained twice, lost, given up, dropped, over the lineage; ``low``/``done``: the final
    checkpoint's task-stream position; ``given_up``/``dropped``: slots the run logged as given up or
    dropped past the staleness bound (any invocation): finished by design without training."""
    kept = lineage(records, starts, final_step)
    steps = Counter(r["step"] for r in kept)
    per_slot = Counter(slot_of(g) for r in kept for g in r["groups"])
    finished = set(range(low)) | set(done)
    gave_up = set(given_up) & finished
    trained = set(per_slot)
    stale = (set(dropped) & finished) - trained - gave_up
    return {
        "lineage_steps": len(kept),
        "lineage_gaps": [s for s in range(1, final_step + 1) if steps[s] != 1],
        "groups_trained": len(trained),
        "groups_trained_twice": sorted(s for s, n in per_slot.items() if n > 1),
        "groups_lost": sorted(finished - trained - gave_up - stale),
        "groups_given_up": len(gave_up),
        "groups_dropped_stale": len(stale),
        "trained_not_finished": sorted(trained - finished),
        "discarded_steps": len(records) - len(kept),  # trained after the checkpoint a rewind went back to
    }


def given_up_slots(lines: Iterable[str]) -> set[int]:
    return {int(m.group(1)) for line in lines if (m := GIVEN_UP.search(line))}


def dropped_slots(lines: Iterable[str]) -> set[int]:
    return {int(m.group(1)) for line in lines if (m := DROPPED.search(line))}
