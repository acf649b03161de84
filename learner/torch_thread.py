"""One thread for every call of a learner rank that runs torch.

A rank's Ray actor serves its calls on a pool of threads (max_concurrency: probes must answer while a
step runs), and Ray picks any free one for the next call. Much of what torch keeps on CPU is kept per
calling thread: ideep's cache of oneDNN computations (bounded per thread, learner/onednn_caches.py),
PyTorch's brgemm kernels, the OpenMP team each calling thread starts, glibc's arena for that thread.
Spread over four threads, a bf16 learner on new shapes each step held 466-474 MB where one thread held
361-364 MB (the tiny model, 300 steps; the larger caches' entries: 166-171 MB mapped against 78-80),
and in a long run the threads Ray picks less often keep filling their caches for tens of minutes.

So the rank hands every ordered call's body to this one thread (the calls already run one at a time,
learner/call_order.py) and waits for it. A daemon thread, not a ThreadPoolExecutor: the executor's
exit hook joins its threads, and a body stuck in a collective with a dead peer would keep the actor's
process from exiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class TorchThread:
    """Runs each call on one daemon thread, in the order given; ``run`` waits for its result."""

    def __init__(self, name: str, initializer: Callable[[], None] | None = None) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict]] = queue.SimpleQueue()
        self._initializer = initializer
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on this thread; its exception is raised here (with its traceback)."""
        if threading.current_thread() is self.thread:  # a body that calls another: already here
            return fn(*args, **kwargs)
        done: Future = Future()
        self._jobs.put((done, fn, args, kwargs))
        return done.result()

    def _serve(self) -> None:
        init_error: BaseException | None = None
        if self._initializer is not None:
            try:
                self._initializer()
            except BaseException as e:
                init_error = e
        while True:
            done, fn, args, kwargs = self._jobs.get()
            if init_error is not None:
                done.set_exception(RuntimeError(f"{self.thread.name} failed to start: {init_error!r}"))
                continue
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as e:
                done.set_exception(e)
            # Hold nothing between calls: the last call's arguments (a step's trajectories) and a failed
            # call's traceback (its frames' tensors) would otherwise live until the next call arrives.
            del done, fn, args, kwargs
