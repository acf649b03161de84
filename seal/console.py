"""Terminal output helpers shared by the `seal` commands."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
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
    from pathlib import Path

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
