"""How an async replica's weights change (actors/generation/async_vllm_engine.py).

What every update does, whole weights or a LoRA adapter (actors/generation/adapter_updates.py): its
mode and version checked and the engine up (``begin_update``), its load bounded by the replica's
``update_timeout_s`` (``within_update_timeout``) and counted (``count_update``).

And a whole version's swap (``WholeVersionUpdates``) under the update modes: the engine paused
(vLLM's ``pause_generation``), the weights loaded, the version label and the prefix cache moved on,
the engine resumed. ``pause`` drains requests in flight for at most the replica's
``drain_timeout_s()``, then goes on as ``abort`` (counted ``drain_timeouts``); ``keep`` freezes them
with their KV cache; ``abort`` continues them on the new weights. A load that fails part way leaves
the model a mix of two versions: every request is held until a whole version lands.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

UPDATE_MODES = {"pause": "wait", "keep": "keep", "abort": "abort"}  # ours -> vLLM's pause_generation mode

Load = Callable[[Any], Awaitable[None]]  # the weights into the engine given


async def begin_update(replica: Any, version: int, mode: str | None) -> tuple[str, Any]:
    """The update's mode (None: the replica's configured one) and its running engine. ValueError for
    an unknown mode or a version older than the one loaded; ReplicaEngineDead for a dead engine."""
    mode = mode or replica.update_mode
    if mode not in UPDATE_MODES:
        raise ValueError(f"update mode must be one of {sorted(UPDATE_MODES)}, got {mode!r}")
    if version < replica._version:
        raise ValueError(f"weight version {version} is older than the loaded {replica._version}")
    engine = await replica._ready()
    replica._check_engine()
    return mode, engine


async def within_update_timeout(replica: Any, step: Awaitable[None], what: str) -> None:
    """``step`` awaited for at most the replica's ``update_timeout_s``; TimeoutError naming ``what``."""
    try:
        await asyncio.wait_for(step, replica.update_timeout_s)
    except TimeoutError:
        raise TimeoutError(
            f"generator replica (pid {os.getpid()}): the {what} did not finish within {replica.update_timeout_s:.0f} s"
        ) from None


def count_update(replica: Any, started: float) -> float:
    """An update done since ``started`` (time.perf_counter): counted; its seconds."""
    seconds = time.perf_counter() - started
    replica.counters.updates += 1
    replica.counters.update_s += seconds
    return seconds


class WholeVersionUpdates:
    """The whole-weights side of one ``AsyncVllmGenerator`` (``replica``): a version's swap under an
    update mode, and the hold after a load that failed part way."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica

    async def run(self, version: int, mode: str | None, load: Load) -> float:
        """Version ``version`` loaded by ``load`` under ``mode``; the seconds it took."""
        r = self.replica
        mode, engine = await begin_update(r, version, mode)
        async with r._update_lock:
            t0 = time.perf_counter()
            was_serving = r._serving.is_set()
            r._serving.clear()  # pieces continued after an abort wait here, not on the old weights
            r._no_update.clear()
            if mode == "abort":
                r._abort_epoch += 1
            try:
                await within_update_timeout(r, self._swap(engine, version, mode, load), f"{mode} update to v{version}")
            except BaseException:
                if was_serving and not r._awaiting_weights:  # failed before the load: the model is whole
                    r._serving.set()
                raise
            finally:
                r._no_update.set()
            r._version = version
            r._awaiting_weights = False
            r._serving.set()
            return count_update(r, t0)

    async def _swap(self, engine: Any, version: int, mode: str, load: Load) -> None:
        await self._pause(engine, mode)
        try:
            await load(engine)
            await engine.collective_rpc("refresh_tied_weights")
            await engine.update_weight_version(str(version))
            # Blocks cached under the old weights go now if nothing holds one (pause, abort); keep's
            # frozen requests hold theirs and vLLM refuses. Either way no later request reads them:
            # its cache_salt is the new version.
            if not await engine.reset_prefix_cache():
                self.replica.counters.prefix_cache_reset_refused += 1
        except BaseException:  # a cancelled load too (the update's bound)
            await self._hold(engine)
            raise
        finally:
            await engine.resume_generation()

    async def _hold(self, engine: Any) -> None:
        """After a load that failed part way (the model a mix of two versions): the requests in flight
        are aborted and go on, as every request, once a whole version lands."""
        r = self.replica
        r._awaiting_weights = True
        r._abort_epoch += 1  # their pieces go on (in the replica's _complete) under the next whole version
        r.counters.failed_updates += 1
        try:
            await engine.pause_generation(mode="abort", clear_cache=True)
        except Exception:  # a dead engine: the fleet replaces the replica (ReplicaEngineDead)
            pass

    async def _pause(self, engine: Any, mode: str) -> None:
        if mode != "pause":  # keep: the frozen requests' KV cache must survive the pause
            await engine.pause_generation(mode=UPDATE_MODES[mode], clear_cache=mode != "keep")
            return
        r = self.replica
        try:
            await asyncio.wait_for(engine.pause_generation(mode="wait", clear_cache=True), r.drain_timeout_s())
        except TimeoutError:
            # What is still running is aborted and continued on the new weights (abort mode), so the
            # update (and the learner's send, by broadcast) never waits out a long request.
            r._abort_epoch += 1
            r.counters.drain_timeouts += 1
            await engine.pause_generation(mode="abort", clear_cache=True)
