"""Calls on one learner rank run one at a time, in the order the driver issued them.

Why: a rank actor serves several calls at once (a ping must get through while a step runs), and
the driver starts some calls without waiting for them (the weight broadcast runs while the next
batch is generated). Every call that touches the model or a process group is a sequence of
collectives (ZeRO-3 gathers, the optimizer's reduce-scatter, barriers, the weight group's
broadcasts); two of them on one communicator at once, or in different orders on different
ranks, hang or abort the group (gloo: SIGABRT in ``Pair::prepareRead``). Ray gives no order
between concurrent calls of a threaded actor, so the driver numbers each rank's calls
(seal/runtime/learner_group.py) and the rank runs them in that order: ticket k waits until k-1 is done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CallOrderError(RuntimeError):
    """A call could not take its turn: its ticket was used already, or the call before it never ended."""


class CallOrder:
    """One rank's turnstile: ``turn(k)`` enters once tickets 0..k-1 have left, and lets k+1 in when it leaves."""

    def __init__(self, name: str) -> None:
        self.name = name  # "learner rank 1 on node 10.0.0.2": errors say whose turnstile
        self._cond = threading.Condition()
        self._next = 0  # the ticket whose turn it is
        self._running: str | None = None  # what the current turn is doing (for the timeout's message)

    @property
    def next_ticket(self) -> int:
        with self._cond:
            return self._next

    @contextmanager
    def turn(self, ticket: int, what: str, timeout_s: float) -> Iterator[None]:
        """Wait for ``ticket``'s turn (at most ``timeout_s``), run the body alone, pass the turn on
        (also when the body raises: the driver decides what a failed call means)."""
        if ticket < 0:
            raise CallOrderError(f"{self.name}: {what} got ticket {ticket}; tickets start at 0")
        with self._cond:
            if ticket < self._next:
                raise CallOrderError(
                    f"{self.name}: {what} got ticket {ticket}, which was used already (next is {self._next})"
                )
            if not self._cond.wait_for(lambda: self._next == ticket, timeout=timeout_s):
                raise CallOrderError(
                    f"{self.name}: {what} (ticket {ticket}) waited {timeout_s:g}s for its turn; "
                    f"ticket {self._next} ({self._running or 'not arrived'}) had not finished"
                )
            self._running = f"{what}, ticket {ticket}"
        try:
            yield
        finally:
            with self._cond:
                self._running = None
                self._next = ticket + 1
                self._cond.notify_all()
