"""Pinned episodes (``trainer.episode_version: pinned``): every turn of an episode on the policy version
its first turn ran on, while new episodes start on the newest.

Under LoRA the async replica serves each published version as an adapter on one base model
(actors/generation/adapter_updates.py), so two versions are served at once at the cost of an
adapter's slot, not of a second model. An episode's requests name it (``GenerationRequest.episode_id``);
the first is served on the replica's newest version and the episode is pinned to it, and every
later one (and every piece of one an update aborts and continues) on that version. The episode's
requests carry the version back (``pin_version``, from the first output), so a replica that does not
hold it (restarted since, or the pin expired) refuses the request, one line naming both, instead of
serving another version: the episode then ends as an infra fault, never trained across versions.

An adapter stays loaded while a request uses it or an episode is pinned to it; the episode's end
(``end``, sent by rollout/play.py when the episode is over) releases it, and the oldest adapter goes
once nothing holds it (``droppable``). An env actor that dies mid-episode sends no end: a pin whose
episode has been silent for ``idle_ttl_s`` is let go, so a dead episode cannot hold an adapter for
ever (an episode that then comes back is refused, as above).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

EPISODE_VERSIONS = ("latest", "pinned")
# An episode silent this long (no request) is presumed gone: its env actor died without ending it.
PIN_IDLE_TTL_S = 1800.0


def droppable(
    loaded: Sequence[int], newest: int | None, in_use: Mapping[int, int], pinned: Collection[int]
) -> list[int]:
    """The retention rule: of the ``loaded`` versions, those to drop now: every one but the newest that
    no request uses (``in_use``: version -> requests running on it) and no live episode is pinned to."""
    return [v for v in loaded if v != newest and not in_use.get(v) and v not in pinned]


@dataclass
class _Pin:
    version: int
    seen: float  # time.monotonic() of the episode's last request


class EpisodePins:
    """Which policy version each live episode is pinned to, on one replica."""

    def __init__(self, idle_ttl_s: float = PIN_IDLE_TTL_S, clock=time.monotonic) -> None:
        self.idle_ttl_s, self._clock = idle_ttl_s, clock
        self._pins: dict[str, _Pin] = {}
        self.expired = 0  # pins let go because their episode went silent (an env actor that died)

    def pin(self, episode_id: str, asked: int | None, newest: int, loaded: Collection[int], who: str) -> int:
        """The version a request of ``episode_id`` runs on: the episode's pin, or for its first request
        ``newest`` (``asked``: the version the episode says it is on, from its first output; None before
        it has one). ValueError when that version is no longer served here (``loaded``: the versions
        this replica holds; ``who`` names the replica)."""
        now = self._clock()
        held = self._pins.get(episode_id)
        if held is not None and asked is not None and held.version != asked:
            raise ValueError(f"{who}: episode {episode_id} is pinned to v{held.version} but asks for v{asked}")
        version = held.version if held is not None else (newest if asked is None else asked)
        if version != newest and version not in loaded:
            raise ValueError(
                f"{who}: episode {episode_id} is pinned to policy v{version}, which this replica no longer "
                f"serves (it serves v{newest}; restarted since, or the pin idled past {self.idle_ttl_s:g} s)"
            )
        self._pins[episode_id] = _Pin(version, now)
        return version

    def end(self, episode_ids: Iterable[str]) -> int:
        """The episodes are over: their pins go. Returns how many were held here."""
        return sum(self._pins.pop(e, None) is not None for e in episode_ids)

    def held(self) -> set[int]:
        """The versions live episodes are pinned to; pins idle past ``idle_ttl_s`` are let go first."""
        now = self._clock()
        for episode, p in list(self._pins.items()):
            if now - p.seen > self.idle_ttl_s:
                del self._pins[episode]
                self.expired += 1
        return {p.version for p in self._pins.values()}

    def episodes(self, version: int) -> int:
        return sum(p.version == version for p in self._pins.values())


def pinned_episodes_problem(
    episode_version: str, async_engine: bool, lora_rank: int | None, lora_publish: str | None, max_loras: int
) -> str | None:
    """Why ``trainer.episode_version=pinned`` cannot work with these settings (None: it can, or it is
    not asked for): one line saying what to set."""
    if episode_version != "pinned":
        return None
    head = "trainer.episode_version=pinned serves an episode's turns on the version it started on"
    if lora_rank is None:
        return (
            f"{head}, which needs LoRA adapters (learner.cfg.lora.rank=R): a full-weight publish replaces the "
            "one model a replica serves, so no older version is left to finish an episode on"
        )
    if lora_publish != "adapter":
        return (
            f"{head}, which needs learner.cfg.lora.publish=adapter: with publish={lora_publish} the replicas load "
            "whole merged weights and serve one version at a time"
        )
    if not async_engine:
        return (
            f"{head}, which needs the async generator (generator=vllm_async_cpu or vllm_async_gpu): the "
            "blocking engine serves one version at a time"
        )
    if max_loras < 2:
        return (
            f"{head} beside the newest, which needs two adapter slots at least: generator.max_loras={max_loras} "
            "(set 2 or more)"
        )
    return None
