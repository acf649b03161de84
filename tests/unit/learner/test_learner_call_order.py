"""learner/call_order.py: a rank runs the driver's calls in ticket order, one at a time, whatever
order its threads take them in; a call that never ends or a reused ticket fails with a named error."""

from __future__ import annotations

import threading
import time

import pytest

from learner.call_order import CallOrder, CallOrderError


def run_in_threads(order: CallOrder, tickets: list[int], body_s: float = 0.02) -> list[tuple[str, int]]:
    """Each ticket in its own thread, started in the given order; the log of entries and exits."""
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def call(ticket: int) -> None:
        try:
            with order.turn(ticket, f"call {ticket}", timeout_s=10):
                with lock:
                    log.append(("enter", ticket))
                time.sleep(body_s)  # long enough that an unordered runner would interleave
                with lock:
                    log.append(("exit", ticket))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(t,)) for t in tickets]
    for t in threads:
        t.start()
        time.sleep(0.005)  # the later ticket really does arrive first
    for t in threads:
        t.join(20)
    assert not errors, errors
    return log


def test_calls_arriving_out_of_order_run_in_ticket_order_one_at_a_time():
    order = CallOrder("learner rank 0 on node test")
    log = run_in_threads(order, [3, 1, 2, 0])
    assert log == [(e, t) for t in range(4) for e in ("enter", "exit")]
    assert order.next_ticket == 4


def test_a_failing_call_passes_the_turn_on():
    order = CallOrder("learner rank 1 on node test")
    with pytest.raises(ValueError):
        with order.turn(0, "train step", 1):
            raise ValueError("the step failed")
    with order.turn(1, "checkpoint", 1):
        pass
    assert order.next_ticket == 2


def test_a_ticket_used_twice_is_refused():
    order = CallOrder("learner rank 0 on node test")
    with order.turn(0, "start", 1):
        pass
    with pytest.raises(
        CallOrderError, match=r"learner rank 0 on node test: train step got ticket 0, which was used already"
    ):
        with order.turn(0, "train step", 1):
            pass


def test_waiting_past_the_timeout_names_the_call_it_waited_for():
    order = CallOrder("learner rank 1 on node 10.0.0.2")
    release = threading.Event()

    def stuck() -> None:
        with order.turn(0, "weight broadcast", 10):
            release.wait(10)

    thread = threading.Thread(target=stuck)
    thread.start()
    time.sleep(0.05)
    try:
        with pytest.raises(
            CallOrderError,
            match=r"learner rank 1 on node 10.0.0.2: train step \(ticket 1\) waited 0.2s "
            r"for its turn; ticket 0 \(weight broadcast, ticket 0\) had not finished",
        ):
            with order.turn(1, "train step", 0.2):
                pass
    finally:
        release.set()
        thread.join(10)
