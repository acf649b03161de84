"""Terminal output helpers shared by the `seal` commands."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


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
