"""`seal evaluate`'s progress on stderr: a line per batch of tasks (per task on the OOD harness views,
whose episodes run one at a time and take minutes each on a CPU), and in between at least one line
every HEARTBEAT_S seconds saying what runs and the time left, so a quiet engine never looks hung."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from seal.console import Heartbeat, duration

HEARTBEAT_S = 30.0


class EvalProgress:
    """Where the evaluation is, and the time left over every snapshot's uncached tasks at the rate
    of the tasks played so far (engine starts and cached tasks are not in the rate: a cached task
    costs nothing). ``clock`` and ``stream`` are for tests; ``start``/``stop`` run the heartbeat."""

    def __init__(
        self,
        to_play: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        stream: TextIO | None = None,
        every: float = HEARTBEAT_S,
    ) -> None:
        self.clock = clock
        self.to_play, self.played, self.playing_s = to_play, 0, 0.0
        self.started = self.batch_started = clock()
        self.batch = 0  # tasks in the batch now playing
        self.heartbeat = Heartbeat(every, clock=clock, stream=stream, left=self._left_now)

    def start(self) -> EvalProgress:
        self.heartbeat.start()
        return self

    def stop(self) -> None:
        self.heartbeat.stop()

    def engine_starts(self, snapshot: str, weights: object, tasks: int, log: object) -> None:
        self.heartbeat.say(f"{snapshot}: starting the engine on {weights} for {tasks} tasks (its own output: {log})")
        self.heartbeat.doing(f"evaluate {snapshot}: starting the engine")

    def batch_starts(self, snapshot: str = "", view: str = "", task_ids: list[str] | tuple[str, ...] = ()) -> None:
        self.batch_started, self.batch = self.clock(), len(task_ids)
        if len(task_ids) == 1:
            self.heartbeat.doing(f"evaluate {snapshot} {view}: task {task_ids[0]} playing")
        else:
            self.heartbeat.doing(f"evaluate {snapshot} {view}: a batch of {len(task_ids)} tasks playing")

    def eta(self, busy: float = 0.0) -> str:
        """The time left: the tasks not yet played at the rate so far, less what the batch now
        playing has already taken; never less than the tasks after that batch (a task past its
        share of the estimate does not make the others free)."""
        left = self.to_play - self.played
        if not left:
            return "none left to play"
        if not self.played:
            return "time left known after the first task"
        rate = self.playing_s / self.played
        return f"about {duration(max(rate * (left - self.batch), rate * left - busy))} left"

    def _left_now(self, _busy: float) -> str:
        busy = self.clock() - self.batch_started if self.batch else 0.0
        return f"played {self.played} of {self.to_play}; {self.eta(busy)}"

    def line(self, snapshot: str, view: str, done: int, tasks: int, ran: bool, count: int) -> None:
        if ran:
            self.played += count
            self.playing_s += self.clock() - self.batch_started
            self.batch = 0
        how = "played" if ran else "from the cache"
        self.heartbeat.say(
            f"evaluate {snapshot} {view}: {done}/{tasks} tasks ({count} {how}); played {self.played} of "
            f"{self.to_play} in {duration(self.clock() - self.started)}; {self.eta()}"
        )
        self.heartbeat.doing(f"evaluate {snapshot} {view}: {done}/{tasks} tasks done, next batch")
