"""Faults of the system injected from a test, through the config's own _target_ (no hook in production code).

- ``FaultyAsyncGenerator``: the async engine, whose ``generate`` raises on the first request of
  chosen episodes of a group's first attempt (slot from the group id ``g{slot:07d}a{attempt}``):
  slot % 4 == 0: rollout 0 (one fault, the group trains on the rest with min_group_size <= n - 1);
  slot % 4 == 1: rollouts 0 and 1 (two faults: below a min_group_size of n - 1, re-issued once).
  ``injected()`` counts what it raised.
- ``FaultyToyEnv``: the toy env, whose own ``step`` raises for one task (``fail_task``), every time.
"""

from __future__ import annotations

import re

from actors.generation.async_vllm_engine import AsyncVllmGenerator
from env_pool.toy.env import ToyToolEnv

_REQUEST = re.compile(r"^g(\d+)a(\d+)-(\d+)-(\d+)$")


def injected_fault(request_id: str) -> bool:
    m = _REQUEST.match(request_id)
    if m is None:
        return False
    slot, attempt, index, step = (int(x) for x in m.groups())
    failing = {0: {0}, 1: {0, 1}}.get(slot % 4, set())
    return attempt == 0 and step == 0 and index in failing


class FaultyAsyncGenerator(AsyncVllmGenerator):
    _injected = 0

    async def generate(self, requests, sampling):
        for r in requests:
            if injected_fault(r.request_id):
                self._injected += 1
                raise RuntimeError(f"injected engine error on request {r.request_id}")
        return await super().generate(requests, sampling)

    def injected(self) -> int:
        return self._injected


class FaultyToyEnv(ToyToolEnv):
    def __init__(self, fail_task: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_task = fail_task

    def step(self, assistant_text: str):
        if self._task is not None and self._task.id == self.fail_task:
            raise RuntimeError("toy tool server unreachable (injected)")
        return super().step(assistant_text)
