"""Where a learner step's time goes: seconds per named phase (``seal bench learner`` reads them).

Off by default: the learner's clock is ``NO_PHASES``, whose ``phase`` is a no-op context. A bench
sets ``learner.phases = PhaseClock(...)``; on CUDA it passes ``torch.cuda.synchronize`` as ``sync``
so a phase ends when its kernels have, not when they were queued.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

PHASES = (
    "collate",  # samples -> tensors, packing
    "policy_forward",  # the policy's forward up to its final hidden states
    "logprobs",  # log p and entropy of the scored tokens from the hidden states (the head)
    "reference_forward",  # the KL reference's forward and log p
    "loss",  # the policy loss and its metrics
    "backward",  # autograd, with ZeRO's gradient reduction hooks
    "optimizer",  # the optimizer's own step
    "zero_bookkeeping",  # the rest of DeepSpeed's step (clipping, partition copies) or torch's clip
)


class PhaseClock:
    """A phase inside another (the head inside the policy's forward) counts to itself only."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._sync = sync
        self._open: list[str] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._sync:
            self._sync()
        t0 = time.perf_counter()
        self._open.append(name)
        try:
            yield
        finally:
            if self._sync:
                self._sync()
            spent = time.perf_counter() - t0
            self._open.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
            if self._open:  # the enclosing phase did not spend this
                self.seconds[self._open[-1]] -= spent

    def take(self) -> dict[str, float]:
        """The seconds so far, and a fresh start."""
        out, self.seconds = self.seconds, dict.fromkeys(PHASES, 0.0)
        return out


class _NoPhases:
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield


NO_PHASES = _NoPhases()
