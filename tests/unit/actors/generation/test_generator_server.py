"""The generator server's engine thread: concurrent callers are merged into
one engine batch, weight updates fall between batches, a restarted server
holds requests until it has weights. The engine here is a recording
Generator (the batching logic is under test, not generation; vLLM behind the
same server runs in tests/integration/test_pipeline.py)."""

from __future__ import annotations

import threading
import time

from actors.generation.server import GeneratorServer
from rollout.generator import GenerationOutput, GenerationRequest, Generator, SamplingConfig


class RecordingGenerator(Generator):
    max_model_len = 128

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.gate = threading.Event()
        self.gate.set()

    @property
    def tokenizer(self):
        return None

    def generate(self, requests, sampling):
        self.gate.wait()
        self.calls.append(("generate", [r.request_id for r in requests]))
        return [
            GenerationOutput(r.request_id, [1, 2], [-0.1, -0.2], "stop", self.policy_version, len(r.prompt_ids), 0)
            for r in requests
        ]

    def update_weights(self, version, source):
        self.calls.append(("update", version))
        self.policy_version = version
        return 0.01


def requests(prefix: str, k: int) -> list[GenerationRequest]:
    return [GenerationRequest(f"{prefix}{i}", [1, 2, 3], 4) for i in range(k)]


def wait_until(predicate, timeout=5.0):
    deadline = time.time() + timeout
    while not predicate() and time.time() < deadline:
        time.sleep(0.01)


def test_concurrent_callers_share_one_engine_batch_and_get_their_own_outputs():
    engine = RecordingGenerator()
    server = GeneratorServer(lambda: engine)
    engine.gate.clear()  # hold the engine so that three callers queue up
    sampling = SamplingConfig(max_new_tokens=4)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("a", server.generate(requests("a", 2), sampling)))
    first.start()
    wait_until(lambda: server._jobs.qsize() == 0)  # the engine holds caller a's batch
    threads = [
        threading.Thread(target=lambda p=p: results.setdefault(p, server.generate(requests(p, 3), sampling)))
        for p in "bc"
    ]
    for t in threads:
        t.start()
    wait_until(lambda: server._jobs.qsize() == 2)
    engine.gate.set()
    for t in [first, *threads]:
        t.join(5)
    assert engine.calls[0] == ("generate", ["a0", "a1"])
    assert sorted(engine.calls[1][1]) == ["b0", "b1", "b2", "c0", "c1", "c2"]  # b and c merged
    assert [o.request_id for o in results["b"]] == ["b0", "b1", "b2"] and server.stats().batches == 2


def test_updates_fall_between_batches_and_stamp_later_outputs():
    engine = RecordingGenerator()
    server = GeneratorServer(lambda: engine)
    sampling = SamplingConfig(max_new_tokens=4)
    assert server.generate(requests("x", 1), sampling)[0].policy_version == 0
    server.update_weights(3, {})
    assert server.generate(requests("y", 1), sampling)[0].policy_version == 3 and server.policy_version() == 3


def test_a_server_waiting_for_weights_holds_requests_until_the_update():
    engine = RecordingGenerator()
    server = GeneratorServer(lambda: engine, await_weights=True)
    out = {}
    caller = threading.Thread(target=lambda: out.setdefault("r", server.generate(requests("z", 1), SamplingConfig())))
    caller.start()
    time.sleep(0.2)
    assert "r" not in out and server.awaiting_weights()
    server.update_weights(5, {})
    caller.join(5)
    assert out["r"][0].policy_version == 5 and engine.calls == [("update", 5), ("generate", ["z0"])]


def test_engine_errors_reach_every_caller_of_the_batch():
    class Failing(RecordingGenerator):
        def generate(self, requests, sampling):
            raise RuntimeError("engine fell over")

    server = GeneratorServer(lambda: Failing())
    try:
        server.generate(requests("e", 1), SamplingConfig())
    except RuntimeError as exc:
        assert "engine fell over" in str(exc)
    else:
        raise AssertionError("no error")
    assert server.update_weights(1, {}) == 0.01  # the engine thread survives


def test_stats_count_the_requests_callers_wait_on_until_their_answers():
    engine = RecordingGenerator()
    server = GeneratorServer(lambda: engine)
    engine.gate.clear()
    sampling = SamplingConfig(max_new_tokens=4)
    callers = [
        threading.Thread(target=server.generate, args=(requests(p, k), sampling)) for p, k in (("a", 2), ("b", 3))
    ]
    for c in callers:
        c.start()
    wait_until(lambda: server.stats().outstanding == 5)
    assert server.stats().outstanding == 5  # queued and in the engine alike
    engine.gate.set()
    for c in callers:
        c.join(timeout=5)
    assert server.stats().outstanding == 0 and server.stats().requests == 5
