"""`seal evaluate`'s progress: a line per batch (per task on a harness view), the time left from the
tasks played so far, and a heartbeat line at least every 30 s in between (a fake clock drives it)."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest

from seal.commands.evaluate_progress import HEARTBEAT_S, EvalProgress
from seal.console import Heartbeat
from seal.errors import CliError


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_batch_with_the_time_left_over_every_snapshot():
    clock, out = FakeClock(), io.StringIO()
    progress = EvalProgress(to_play=4, clock=clock, stream=out)
    progress.line("A_0", "id", 3, 5, ran=False, count=3)  # cached: free, no rate yet
    progress.batch_starts("A_0", "id", ["a", "b"])
    clock.now += 20
    progress.line("A_0", "id", 5, 5, ran=True, count=2)
    progress.batch_starts("A_1", "id", ["a", "b"])
    clock.now += 20
    progress.line("A_1", "id", 2, 5, ran=True, count=2)
    first, second, last = out.getvalue().splitlines()
    assert (
        first
        == "evaluate A_0 id: 3/5 tasks (3 from the cache); played 0 of 4 in 0 s; time left known after the first task"
    )
    assert second == "evaluate A_0 id: 5/5 tasks (2 played); played 2 of 4 in 20 s; about 20 s left"
    assert last == "evaluate A_1 id: 2/5 tasks (2 played); played 4 of 4 in 40 s; none left to play"


def test_a_quiet_stretch_gets_a_heartbeat_every_30_s_naming_the_task_and_the_time_left():
    clock, out = FakeClock(), io.StringIO()
    progress = EvalProgress(to_play=4, clock=clock, stream=out)
    beat = progress.heartbeat
    progress.engine_starts("A_0", "runs/x/snapshots/A_0", 4, "runs/x/evaluation/evaluate.log")
    for _ in range(int(HEARTBEAT_S) - 1):  # the thread ticks every second: silent under 30 s
        clock.now += 1
        assert not beat.tick()
    clock.now += 1
    assert beat.tick()
    progress.batch_starts("A_0", "tau2_retail", ["tau2:retail:0"])
    clock.now += 100  # a harness task alone: 100 s
    progress.line("A_0", "tau2_retail", 1, 4, ran=True, count=1)
    progress.batch_starts("A_0", "tau2_retail", ["tau2:retail:1"])
    clock.now += 29
    assert not beat.tick()  # the task line above counts: 29 s since it
    clock.now += 16
    assert beat.tick()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("A_0: starting the engine on runs/x/snapshots/A_0 for 4 tasks")
    assert lines[1] == (
        "evaluate A_0: starting the engine: 30 s so far; played 0 of 4; time left known after the first task"
    )
    assert lines[2].startswith("evaluate A_0 tau2_retail: 1/4 tasks (1 played); played 1 of 4")
    # 3 tasks left at 100 s each, 45 s of the one playing already spent
    assert lines[3] == (
        "evaluate A_0 tau2_retail: task tau2:retail:1 playing: 45 s so far; played 1 of 4; about 4 min 15 s left"
    )
    assert len(lines) == 4
    clock.now += 300  # far past its 100 s share: the two tasks after it still take 200 s
    assert beat.tick()
    assert out.getvalue().splitlines()[-1].endswith("5 min 45 s so far; played 1 of 4; about 3 min 20 s left")


def test_the_heartbeat_thread_prints_on_its_own_and_stops():
    out = io.StringIO()
    with Heartbeat(0.01, stream=out, left=lambda busy: "left: some") as beat:
        beat.doing("waiting")
        deadline = 200
        while "waiting" not in out.getvalue() and deadline:
            time.sleep(0.05)
            deadline -= 1
    assert re.search(r"^waiting: \d+ s so far; left: some$", out.getvalue(), re.M), out.getvalue()
    assert beat._thread is not None and not beat._thread.is_alive()


def test_ablate_reports_each_child_command_and_the_time_left_at_its_pace():
    from seal.commands.ablate import ChildCommands

    clock, out = FakeClock(), io.StringIO()
    calls = ChildCommands(4, clock=clock, stream=out)
    calls.paced.starts("ablate: seal train (its output: DIR/full.train.log)")
    clock.now += 30
    assert calls.heartbeat.tick()
    clock.now += 70
    calls.paced.ends()  # one command ran, 100 s
    calls.skip()  # the next run was trained already: 3 commands in all
    calls.paced.starts("ablate: seal evaluate DIR/full (its output: DIR/full.evaluate.log)")
    clock.now += 40
    assert calls.heartbeat.tick()
    first, second = out.getvalue().splitlines()
    assert first == (
        "ablate: seal train (its output: DIR/full.train.log): 30 s so far; "
        "4 of 4 commands left; time left known after the first"
    )
    assert second == (
        "ablate: seal evaluate DIR/full (its output: DIR/full.evaluate.log): 40 s so far; "
        "2 of 3 commands left, about 2 min 40 s left"
    )


def test_ablate_trains_a_run_once_and_skips_it_when_asked_again(tmp_path):
    """A finished training run leaves its marker, so the same ablation asked again (say, with one
    more arm or seed) evaluates it without training it again or refusing its directory."""
    from argparse import Namespace

    from seal.commands.ablate import ChildCommands, _run_all

    class Recorded(ChildCommands):
        def __init__(self) -> None:
            super().__init__(2, stream=io.StringIO())
            self.argvs: list[list[str]] = []

        def run(self, argv, log, capture=False):
            self.argvs.append(argv)
            run_dir = Path(next(a for a in argv if a.startswith("run_dir=")).split("=", 1)[1])
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "run.json").write_text("{}")  # what a finished `seal train` leaves
            return ""

    args = Namespace(no_views=True, limit=None, views=None)
    plan = {"changes": {"lora": "x"}}
    first, again = Recorded(), Recorded()
    _run_all(args, ["lora"], [0], ["trainer.steps=1"], plan, tmp_path, first, [], {}, {})
    _run_all(args, ["lora"], [0], ["trainer.steps=1"], plan, tmp_path, again, [], {}, {})
    assert [a[0] for a in first.argvs] == ["train"] and again.argvs == []
    changed = Recorded()
    with pytest.raises(CliError, match="holds a run made with other arguments"):
        _run_all(args, ["lora"], [0], ["trainer.steps=2"], plan, tmp_path, changed, [], {}, {})
