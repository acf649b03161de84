"""Terminal output helpers shared by the `seal` commands."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator


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
