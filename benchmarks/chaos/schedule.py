"""The soak's fault schedule: seeded, so a run's faults (kinds, times, targets, pauses) are the same
for the same seed and duration."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

# What each kind does (benchmarks/chaos/soak.py injects it):
KINDS = {
    "env_kill": "SIGKILL an env actor's process",
    "env_stop": "SIGSTOP an env actor's process, SIGCONT after a pause",
    "generator_kill": "SIGKILL a generator replica's process",
    "generator_stop": "SIGSTOP a generator replica's process, SIGCONT after a pause",
    "learner_kill": "SIGKILL the learner rank's process",
    "learner_stop": "SIGSTOP the learner rank's process, SIGCONT after a pause",
    "engine_error": "the next generate calls of a replica raise (a trigger its _target_ claims)",
    "weight_round": "the next weight update of a replica fails after its first bucket",
    "driver_kill": "SIGKILL the `seal train` driver, then resume=RUN_DIR",
    "disk_full": "fill the storage's tmpfs: the next checkpoint or snapshot write meets ENOSPC",
}
# Faults the run does not survive in place: it ends (a learner rank has no stand-in; a checkpoint the
# disk cannot hold stops the run) and `resume=RUN_DIR` continues it from the last checkpoint.
RUN_ENDING = ("learner_kill", "driver_kill", "disk_full")
# Relative frequency of each kind in a random schedule: each run-ending fault costs a restart (about
# a minute here), so they come less often.
WEIGHTS = {k: (0.6 if k in RUN_ENDING else 1.0) for k in KINDS}


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the run's first checkpoint (a fault whose target is not up yet waits for it)
    kind: str
    pick: float  # which target of several (env actors, replicas): index = int(pick * count)
    pause_s: float  # SIGSTOP kinds: seconds stopped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def random_schedule(
    seed: int,
    duration_s: float,
    mean_gap_s: float,
    kinds: tuple[str, ...] = tuple(KINDS),
    steady_tail_s: float = 0.0,
) -> list[Fault]:
    """Faults at exponential gaps of mean ``mean_gap_s`` over ``duration_s``, kinds drawn by ``WEIGHTS``.

    In the last ``steady_tail_s`` only kinds the run survives in place are drawn: no restart then, so
    the processes that live through the tail show whether memory grows (a restart resets it)."""
    rng = random.Random(seed)
    survivable = tuple(k for k in kinds if k not in RUN_ENDING)
    if steady_tail_s > 0 and not survivable:
        raise ValueError(f"a steady tail needs a kind the run survives in place; --kinds has only {', '.join(kinds)}")
    out, t = [], rng.expovariate(1 / mean_gap_s)
    while t < duration_s:
        pool = survivable if t >= duration_s - steady_tail_s else kinds
        kind = rng.choices(pool, [WEIGHTS[k] for k in pool])[0]
        out.append(Fault(round(t, 1), kind, rng.random(), round(rng.uniform(5, 20), 1)))
        t += rng.expovariate(1 / mean_gap_s)
    return out


def one_each(seed: int, gap_s: float, kinds: tuple[str, ...] = tuple(KINDS)) -> list[Fault]:
    """Every kind once, in a seeded order, ``gap_s`` apart (the short fixed-seed soak of the tests)."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    return [Fault(gap_s * (i + 1), k, rng.random(), round(rng.uniform(5, 12), 1)) for i, k in enumerate(order)]
