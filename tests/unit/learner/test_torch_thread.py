"""learner/torch_thread.py: one daemon thread runs a rank's torch calls, whoever asks."""

from __future__ import annotations

import threading

import pytest

from learner.torch_thread import TorchThread


def test_calls_from_any_thread_run_on_the_one_thread_in_order():
    worker = TorchThread("learner-torch")
    seen: list[tuple[str, int]] = []
    callers = [
        threading.Thread(target=lambda i=i: worker.run(lambda: seen.append((threading.current_thread().name, i))))
        for i in range(5)
    ]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=10)
    assert sorted(i for _, i in seen) == list(range(5))
    assert {name for name, _ in seen} == {"learner-torch"}
    assert worker.thread.daemon  # a stuck body never holds the process at exit


def test_a_result_and_an_exception_come_back_to_the_caller():
    worker = TorchThread("t")
    assert worker.run(lambda a, b=0: a + b, 2, b=3) == 5

    def fails() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        worker.run(fails)
    assert worker.run(lambda: "still serving") == "still serving"


def test_the_initializer_runs_on_the_thread_first_and_its_failure_names_it():
    ran_on: list[str] = []
    worker = TorchThread("init-ok", initializer=lambda: ran_on.append(threading.current_thread().name))
    worker.run(lambda: None)
    assert ran_on == ["init-ok"]

    def no_threads() -> None:
        raise OSError("cannot set threads")

    broken = TorchThread("init-bad", initializer=no_threads)
    with pytest.raises(RuntimeError, match=r"init-bad failed to start: OSError\('cannot set threads'\)"):
        broken.run(lambda: None)


def test_a_call_made_from_the_thread_itself_runs_in_place():
    worker = TorchThread("t")
    assert worker.run(lambda: worker.run(lambda: threading.current_thread().name)) == "t"
