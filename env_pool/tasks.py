"""What every environment's tasks share: user turns with the calls a correct agent makes, a task of
such turns, and task ids made from an index (so a task id means the same task on every process and
every run), split into train and test by index."""

from __future__ import annotations

from dataclasses import dataclass

from env_pool.tool_calls import ToolCall

SPLITS = ("train", "test", "all")


@dataclass(frozen=True)
class Turn:
    """One user turn: what the user says, the calls a correct agent makes (none: the turn expects no
    call) and what it then replies (the reference's closing step)."""

    user: str
    expected: tuple[ToolCall, ...] = ()
    reply: str = "Done."


@dataclass(frozen=True)
class TurnTask:
    """A task of user turns: what the step loop reads (``id``, ``category``, ``num_turns``). Subclass it
    (a frozen dataclass) for what your verifier needs besides, e.g. the state before the first turn."""

    id: str
    category: str
    turns: tuple[Turn, ...]

    @property
    def num_turns(self) -> int:
        return len(self.turns)


@dataclass(frozen=True)
class IndexedSplits:
    """Task ids ``{prefix}{i}`` for i in [0, num_tasks): the first ``num_train`` are the train split,
    the rest the test split (``all``: both). ``name`` names the tasks in errors."""

    prefix: str
    num_train: int
    num_tasks: int
    name: str = ""

    def __post_init__(self) -> None:
        if not self.prefix or not 0 < self.num_train < self.num_tasks:
            raise ValueError(
                f"IndexedSplits needs a prefix and 0 < num_train < num_tasks, got {self.prefix!r}, "
                f"{self.num_train}, {self.num_tasks}"
            )

    def ids(self, split: str) -> list[str]:
        ranges = {"train": range(self.num_train), "test": range(self.num_train, self.num_tasks)}
        ranges["all"] = range(self.num_tasks)
        if split not in ranges:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(ranges)}")
        return [f"{self.prefix}{i}" for i in ranges[split]]

    def index(self, task_id: str) -> int:
        """The task's index; a KeyError names the ids there are."""
        digits = task_id.removeprefix(self.prefix)
        if not task_id.startswith(self.prefix) or not digits.isdigit() or int(digits) >= self.num_tasks:
            what = f"{self.name} task id" if self.name else "task id"
            raise KeyError(f"unknown {what} {task_id!r} ({self.prefix}0 .. {self.prefix}{self.num_tasks - 1})")
        return int(digits)
