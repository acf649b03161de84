"""What `seal train` prints while it runs: one line per event, from the first second.

    [0:00:04] ray      up in 2.9 s (local, 2 CPUs)
    [0:03:11] group    g0000000a0 done on env-0 in 41 s: rewards 0 1 (mean 0.50), 212 tokens (5.2 tok/s), policy v0, interface v0
    [0:03:12] learner  step 1/2: train on 1 group (2 trajectories)
    [0:03:20] step     1/2: reward 0.50, loss 0.012, kl 0.000, grad norm 0.41; policy v1, interface v0; ...; about 4 min left

Every line is ``[elapsed] kind message``, the kind padded to one width, so
the eye runs down the column. The text functions are pure (tested alone);
``Progress`` only adds the clock and the stream. The learner's phase is what
the driver is waiting on (the remote call it made), so it costs no call to
the learner. ``Progress(quiet=True)`` prints nothing (``seal train --quiet``,
and pipelines built in tests or benchmarks).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

from seal.config import Settings

KIND_WIDTH = 8
# Above this many groups per step, group lines would flood: one line per batch's worth of groups instead.
GROUP_LINES_MAX = 8


# ------------------------------------------------------------------ pure text
def clock(seconds: float) -> str:
    """Elapsed time as h:mm:ss."""
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def duration(seconds: float) -> str:
    """A span a person reads at a glance: 0.4 s, 41 s, 3 min 05 s, 1 h 02 min."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def line(elapsed: float, kind: str, message: str) -> str:
    return f"[{clock(elapsed)}] {kind:<{KIND_WIDTH}} {message}"


def number(x: float) -> str:
    """A reward as short as it is exact enough: 0, 1, 0.5, 0.33."""
    return f"{x:.2f}".rstrip("0").rstrip(".") if x == x else "nan"


def scored_rewards(rewards: Sequence[float], faults: Sequence[str]) -> list[float]:
    """The rewards the policy earned: those of episodes no infra fault ended (``faults``: a kind or "")."""
    return [r for r, fault in zip(rewards, faults or [""] * len(rewards)) if not fault]


def rewards_text(rewards: Sequence[float], shown: int = 8, faults: Sequence[str] = ()) -> str:
    """A faulted episode (``faults``, per rollout) shows as "-": not scored, out of the mean."""
    if not rewards:
        return "rewards unknown"
    marks = [number(r) if not f else "-" for r, f in zip(rewards, faults or [""] * len(rewards))]
    head = " ".join(marks[:shown]) + (" ..." if len(rewards) > shown else "")
    scored = scored_rewards(rewards, faults)
    return f"rewards {head} " + (f"(mean {sum(scored) / len(scored):.2f})" if scored else "(none scored)")


def eta_s(durations: Sequence[float], remaining: int) -> float | None:
    """Time left from the step durations so far. The first step also filled the
    pipeline (the first groups, the first publish), so once there are later
    ones it is left out of the average."""
    if remaining <= 0:
        return 0.0
    if not durations:
        return None
    steady = durations[1:] if len(durations) > 1 else durations
    return remaining * sum(steady) / len(steady)


def learner_work(groups: int, trajectories: int, mini_batch_groups: int, old_logprobs: str) -> str:
    """What ``learner.train`` does for a batch: the old-logprob pass is an extra
    forward over every mini-batch but the first (whose training forward runs at
    the old weights), so it happens only with ``old_logprobs=recompute`` and more
    than one mini-batch."""
    minis = max(1, math.ceil(groups / max(1, mini_batch_groups)))
    what = f"train on {groups} group{'s' * (groups != 1)} ({trajectories} trajectories"
    what += f", {minis} mini-batches)" if minis > 1 else ")"
    if old_logprobs == "recompute" and minis > 1:
        what = "old-logprob pass, then " + what
    return what


def engines_text(s: Settings) -> str:
    """``the generator (VLLMGenerator, model tiny) and the learner (ZeRO-2)`` from the typed groups."""
    lc = s.learner.cfg
    learner = f"ZeRO-{lc.zero_stage}" if lc.backend == "deepspeed" else lc.backend
    if s.learner.world_size > 1:
        learner += f" over {s.learner.world_size} ranks"
    return f"the generator ({s.generator.target.rsplit('.', 1)[-1]}, model {s.model.path}) and the learner ({learner})"


def guideline_change(before: Sequence[str] | None, after: Sequence[str]) -> str:
    """``+state_aware -format`` (empty when nothing changed or nothing came before)."""
    if before is None:
        return ""
    on = [g for g in after if g not in before]
    off = [g for g in before if g not in after]
    return " ".join([*(f"+{g}" for g in on), *(f"-{g}" for g in off)])


def group_done_text(report, filtered: bool) -> str:
    rate = report.generation.generated_tokens / report.wall_s if report.wall_s > 0 else 0.0
    note = "; equal rewards: filtered" if filtered else ""
    faults = [k for k in report.faults if k]
    if faults:  # those rewards are not the policy's: out of every statistic (docs/main-job.md, "Infra faults")
        kinds = ", ".join(sorted(set(faults)))
        note += f"; {len(faults)} of {len(report.faults)} episodes ended by an infra fault ({kinds}): not scored"
    return (
        f"{report.group_id} done on {report.actor} in {duration(report.wall_s)}: "
        f"{rewards_text(report.rewards, faults=report.faults)}{note}, "
        f"{report.generation.generated_tokens} tokens ({rate:.1f} tok/s), policy v{report.start_version}, "
        f"interface v{report.interface_version}"
    )


def groups_batch_text(done: int, rewards: Sequence[float], tokens: int, seconds: float, in_flight: int) -> str:
    """The line that stands for a batch's worth of groups when there are too many for a line each."""
    mean = f"mean reward {sum(rewards) / len(rewards):.2f}" if rewards else "no rewards"
    rate = tokens / seconds if seconds > 0 else 0.0
    return f"{done} groups done ({mean}), {tokens} tokens ({rate:.1f} tok/s), {in_flight} in flight"


def _figure(name: str, value: Any, fmt: str = ".3f") -> str | None:
    return None if value is None else f"{name} {value:{fmt}}"


def step_text(
    row: Mapping[str, Any], target: int, guidelines_before: Sequence[str] | None, seconds: float, eta: float | None
) -> str:
    """The line that closes a learner step (a row of metrics.jsonl); ``seconds`` since the previous
    step ended (the row's step_s of a first step also counts the engines' start)."""
    head = f"{row['step']}/{target}"
    if row.get("skipped"):
        head += f" skipped ({row.get('filtered_groups', 0)} groups with equal rewards, no update)"
    figures = [f"reward {row['reward_mean']:.2f}"]
    figures += [
        f
        for f in (
            _figure("loss", row.get("loss")),
            _figure("kl", row.get("kl")),
            _figure("grad norm", row.get("grad_norm"), ".2f"),
        )
        if f
    ]
    held = int(row.get("nonfinite_grad_steps") or 0)
    if held:  # learner/optimizer.py: nothing of those mini-batches reached the weights
        figures.append(f"{held} update{'s' * (held != 1)} not applied (gradient norm not finite)")
    change = guideline_change(guidelines_before, row.get("active_guidelines") or [])
    versions = f"policy v{row['policy_version']}, interface v{row['interface_version']}" + (
        f" ({change})" if change else ""
    )
    rate = f"{row.get('gen_tokens_per_s', 0.0):.1f} generated tok/s"
    left = "" if eta is None else ("; done" if row["step"] >= target else f"; about {duration(eta)} left")
    return f"{head}: {', '.join(figures)}; {versions}; {rate}; step {duration(seconds)}{left}"


# ------------------------------------------------------------------ the printer
class Progress:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None, heartbeat_s: float = 30.0) -> None:
        self.quiet = quiet
        self.stream = stream
        self.heartbeat_s = heartbeat_s  # a line at least this often while a timed wait lasts
        self.started = time.monotonic()
        self.group_lines, self.groups_per_step = True, 1
        self.target = 0
        self._step_ends: list[float] = []  # seconds each step of this run took
        self._last_end: float | None = None
        self._guidelines: list[str] | None = None
        self._batch: list[Any] = []  # reports since the last groups line (many groups per step)
        self._batch_started = self.started

    def emit(self, kind: str, message: str) -> None:
        if self.quiet:
            return
        print(line(time.monotonic() - self.started, kind, message), file=self.stream or sys.stdout, flush=True)

    @contextlib.contextmanager
    def timed(self, kind: str, starting: str, done: str) -> Iterator[None]:
        """A start line now (the wait may be minutes: 3.5 of them to start the engines under load),
        a line every ``heartbeat_s`` while it lasts, and ``done in N s`` after."""
        self.emit(kind, starting)
        t0 = time.monotonic()
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                self.emit(kind, f"still {starting}: {duration(time.monotonic() - t0)} so far")

        beating = threading.Thread(target=beat, name="seal-progress-heartbeat", daemon=True)
        beating.start()
        try:
            yield
        finally:
            stop.set()
            beating.join(timeout=5.0)
        self.emit(kind, f"{done} in {duration(time.monotonic() - t0)}")

    # --------------------------------------------------------- the loop's events
    def run_started(self, target: int, groups_per_step: int, guidelines: Sequence[str] | None = None) -> None:
        """``target``: the step the run stops at; ``guidelines``: those active as it starts (None: unknown)."""
        self.target = target
        self.group_lines, self.groups_per_step = groups_per_step <= GROUP_LINES_MAX, groups_per_step
        self._last_end = time.monotonic()
        self._step_ends.clear()
        self._guidelines = list(guidelines) if guidelines is not None else None

    def group_started(self, job, actor: str, acked_version: int) -> None:
        if self.group_lines:
            self.emit(
                "group",
                f"{job.group_id} started on {actor}: task {job.task_id} (slot {job.slot}, policy v{acked_version})",
            )

    def group_done(self, report, filtered: bool, in_flight: int) -> None:
        if self.group_lines:
            self.emit("group", group_done_text(report, filtered))
            return
        self._batch.append(report)
        if len(self._batch) >= self.groups_per_step:
            now = time.monotonic()
            rewards = [r for rep in self._batch for r in scored_rewards(rep.rewards, rep.faults)]
            self.emit(
                "groups",
                groups_batch_text(
                    len(self._batch),
                    rewards,
                    sum(r.generation.generated_tokens for r in self._batch),
                    now - self._batch_started,
                    in_flight,
                ),
            )
            self._batch, self._batch_started = [], now

    def group_dropped(self, group_id: str, slot: int, staleness: int, max_staleness: int) -> None:
        """A group past the staleness bound (trainer.stale_policy=drop): its slot is done without
        training, so every one is said, whatever the group lines (the soak's books read it)."""
        self.emit(
            "group",
            f"{group_id} dropped (slot {slot}): staleness {staleness} past trainer.max_staleness "
            f"{max_staleness}; its slot is done, never trained",
        )

    def learner_train(self, step: int, work: str) -> None:
        self.emit("learner", f"step {step}/{self.target}: {work}")

    def learner_phase(self, phase: str) -> None:
        self.emit("learner", phase)

    def step_done(self, row: Mapping[str, Any]) -> None:
        now = time.monotonic()
        seconds = now - (self._last_end if self._last_end is not None else self.started)
        self._step_ends.append(seconds)
        self._last_end = now
        eta = eta_s(self._step_ends, self.target - int(row["step"]))
        self.emit("step", step_text(row, self.target, self._guidelines, seconds, eta))
        self._guidelines = list(row.get("active_guidelines") or [])
