"""Terminal output helpers shared by the `seal` commands."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def stdout_to_stderr(active: bool) -> Iterator[None]:
    """With --json, stdout carries only the JSON objects: everything else
    (vLLM, DeepSpeed and Ray print from C and Python alike) goes to stderr,
    redirected at the file-descriptor level so child processes inherit it."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def output_to_file(path) -> Iterator[None]:
    """Everything written to stdout and stderr (Python and C alike: an engine's start-up
    chatter) goes to ``path`` (appended) instead, at the file-descriptor level."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


_results: TextIO | None = None


def results() -> TextIO:
    """Where a command prints its result: stdout, also after engine_output_to_stderr()."""
    return _results if _results is not None else sys.stdout


def engine_output_to_stderr() -> None:
    """For the rest of this process file descriptor 1 is stderr, so whatever an engine writes to
    stdout (vLLM's logger does, as do C code, child processes and shutdown at exit) lands on stderr;
    results() keeps the original stdout for the command's result alone (its JSON under --json).
    Called by the `seal` program for the commands that start engines in their own process."""
    global _results
    if _results is None:
        sys.stdout.flush()
        _results = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)


class Heartbeat:
    """At least one line every ``every`` seconds while a long command works: what it is doing now,
    for how long, and the time left as ``left()`` estimates it. ``say`` prints a line at once (a
    task done) and restarts the count; ``doing`` names the next activity. Lines go to a copy of
    file descriptor 2 taken at the start, so they reach the terminal while an engine's own output
    is sent to a log file (output_to_file). ``clock`` and ``stream`` are there for tests; ``start``
    runs ``tick`` on a daemon thread, ``stop`` ends it."""

    def __init__(
        self,
        every: float = 30.0,
        *,
        clock: Callable[[], float] | None = None,
        stream: TextIO | None = None,
        left: Callable[[float], str] | None = None,
    ) -> None:
        self.every, self.clock = every, clock or time.monotonic
        self._own_stream = stream is None
        self.stream = stream if stream is not None else os.fdopen(os.dup(2), "w", buffering=1)
        self.left = left or (lambda _busy: "time left unknown")
        self.what, self.since = "starting", self.clock()
        self.last_line = self.since
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def doing(self, what: str) -> None:
        with self._lock:
            self.what, self.since = what, self.clock()

    def say(self, line: str) -> None:
        with self._lock:
            self._print(line)

    def tick(self) -> bool:
        """Print the current activity if no line went out for ``every`` seconds; True if it did."""
        with self._lock:
            now = self.clock()
            if now - self.last_line < self.every:
                return False
            busy = now - self.since
            self._print(f"{self.what}: {duration(busy)} so far; {self.left(busy)}")
            return True

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
        self.last_line = self.clock()

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="seal-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._own_stream:
            self.stream.close()


def duration(seconds: float) -> str:
    """``2 min 05 s`` or ``40 s``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


class Paced:
    """A known number of items done one after the other (tasks, groups, child commands): the
    Heartbeat names the item under way, and the time left is the items not done at the mean pace
    of those done, never less than the items after the one under way. ``skip`` drops an item
    that needs no work (a finished run found again)."""

    def __init__(
        self,
        total: int,
        noun: str,
        *,
        clock: Callable[[], float] | None = None,
        stream: TextIO | None = None,
        every: float = 30.0,
    ) -> None:
        self.total, self.noun, self.done, self.spent = total, noun, 0, 0.0
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self.heartbeat = Heartbeat(every, clock=self.clock, stream=stream, left=self.left)

    def left(self, busy: float) -> str:
        remaining = self.total - self.done
        if not self.done:
            return f"{remaining} of {self.total} {self.noun} left; time left known after the first"
        pace = self.spent / self.done
        estimate = max(pace * (remaining - 1), pace * remaining - busy)
        return f"{remaining} of {self.total} {self.noun} left, about {duration(estimate)} left"

    def starts(self, what: str) -> None:
        self.started = self.clock()
        self.heartbeat.doing(what)

    def ends(self) -> None:
        self.spent += self.clock() - self.started
        self.done += 1

    def skip(self) -> None:
        self.total -= 1
