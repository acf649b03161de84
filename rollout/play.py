"""Multi-turn rollouts: generator and environment alternate until the episode ends.

A group is n rollouts of one task under one interface state. With a blocking
engine they advance in lockstep, so every generation call is one batch (and
the shared prompt prefix is computed once, then served from vLLM's prefix
cache); with a continuous-batching engine each episode sends its next turn
as soon as its env step is done (``lockstep=False``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from env_pool.base import Environment, Outcome
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from replay.messages import Segment, Trajectory
from rollout.chat import ChatTokenizer, Message
from rollout.generator import GenerationRequest, Generator, GeneratorUnavailable, SamplingConfig

MIN_NEW_TOKENS = 8  # below this much room left, the episode ends as context overflow


@dataclass
class _Episode:
    env: Environment
    index: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    before: list[Message] = field(default_factory=list)  # conversation before the next generation
    prompt_length: int = 0
    generate_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None

    def add(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


@dataclass
class GroupStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    generate_s: float = 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_group(
    make_env: Callable[[], Environment],
    generator: Generator,
    chat: ChatTokenizer,
    task_id: str,
    n: int,
    sampling: SamplingConfig,
    interface: InterfaceState = RAW_INTERFACE,
    group_id: str | None = None,
    seed: int | None = None,
    stats: GroupStats | None = None,
    lockstep: bool = True,
) -> list[Trajectory]:
    """n rollouts of ``task_id``; each ends with a record, whatever happens.

    ``lockstep``: the episodes' turns go to the generator as one batch per step
    (a blocking engine serves the group together). False: each episode runs on
    its own thread and sends its next turn as soon as its env step is done, so
    with a continuous-batching engine no episode waits for its siblings' turns.
    """
    if n < 1:
        raise ValueError(f"a group needs n >= 1 rollouts, got {n}")
    return run_episodes(make_env, generator, chat, [task_id] * n, sampling, interface, group_id, seed, stats, lockstep)


def run_episodes(
    make_env: Callable[[], Environment],
    generator: Generator,
    chat: ChatTokenizer,
    task_ids: Sequence[str],
    sampling: SamplingConfig,
    interface: InterfaceState = RAW_INTERFACE,
    group_id: str | None = None,
    seed: int | None = None,
    stats: GroupStats | None = None,
    lockstep: bool = True,
) -> list[Trajectory]:
    """One episode per entry of ``task_ids`` (a group repeats one task; a frozen
    evaluation plays many tasks), played together as run_group describes: with a
    blocking engine every generation step of every episode is one batch."""
    if not task_ids:
        raise ValueError("run_episodes needs at least one task id")
    group_id = group_id or uuid.uuid4().hex[:12]
    start_version = generator.policy_version
    t_start = time.perf_counter()
    episodes = []
    for i, task_id in enumerate(task_ids):
        ep = _Episode(env=make_env(), index=i)
        ep.before = ep.env.reset(task_id, interface)
        if not ep.env.done:
            ep.add(chat.prompt_ids(ep.before), 0)
        ep.prompt_length = len(ep.token_ids)
        episodes.append(ep)

    if lockstep:
        _play_lockstep(episodes, generator, chat, sampling, group_id, seed)
    else:
        _play_independently(episodes, generator, chat, sampling, group_id, seed)

    total = time.perf_counter() - t_start
    trajectories = []
    for ep in episodes:
        res = ep.env.result()
        traj = Trajectory(
            task_id=res.task_id,
            category=res.category,
            env=res.env,
            group_id=group_id,
            rollout_index=ep.index,
            interface_version=interface.version,
            token_ids=ep.token_ids,
            loss_mask=ep.loss_mask,
            logprobs=ep.logprobs,
            prompt_length=ep.prompt_length,
            segments=ep.segments,
            reward=float(res.reward),
            success=res.success,
            progress=res.progress,
            tags=res.tags,
            labels=res.labels,
            error_type=res.error_type,
            outcome=res.outcome,
            num_tool_calls=res.num_tool_calls,
            num_steps=res.num_steps,
            timings={
                "generate_s": ep.generate_s,
                "env_s": res.env_seconds,
                "judge_s": res.judge_seconds,
                "total_s": total,
            },
            error=ep.error,
            start_version=start_version,
            num_parse_errors=res.num_parse_errors,
        )
        traj.validate()
        trajectories.append(traj)
        if stats is not None:
            stats.prompt_tokens += ep.prompt_tokens
            stats.cached_prompt_tokens += ep.cached_tokens
            stats.generated_tokens += traj.num_generated_tokens
            stats.generate_s += ep.generate_s
    return trajectories


def _request(
    ep: _Episode, generator: Generator, sampling: SamplingConfig, group_id: str, seed: int | None, step: int
) -> GenerationRequest | None:
    """The episode's next generation request, or None when no room is left (the episode ends)."""
    room = generator.max_model_len - len(ep.token_ids)
    if room < MIN_NEW_TOKENS:
        ep.env.end(Outcome.CONTEXT_OVERFLOW)
        return None
    req_seed = None if seed is None else seed * 1_000_003 + ep.index * 1009 + step
    return GenerationRequest(
        f"{group_id}-{ep.index}-{step}", ep.token_ids, min(sampling.max_new_tokens, room), req_seed
    )


def _failed(ep: _Episode, exc: Exception) -> None:
    """A generator failure ends the episode with a named error."""
    ep.error = f"generation failed: {exc.__class__.__name__}: {exc}"
    ep.env.end(Outcome.ABORTED)


def _apply(
    ep: _Episode, req: GenerationRequest, out, chat: ChatTokenizer, sampling: SamplingConfig, elapsed: float
) -> None:
    """One generated turn into the episode: its tokens (a segment per policy version), the env's step, the reply."""
    ep.generate_s += elapsed
    ep.prompt_tokens += out.prompt_tokens
    ep.cached_tokens += out.cached_prompt_tokens
    start = len(ep.token_ids)
    ep.add(out.token_ids, 1, out.logprobs)
    ep.segments.extend(Segment(start + s.start, start + s.end, s.version) for s in out.version_spans())
    text, ended = chat.completion_text(out.token_ids)
    result = ep.env.step(text)
    new_messages = [] if result.done else result.messages
    ep.add(chat.continuation_ids(ep.before, text, ended, new_messages), 0)
    ep.before = ep.before + [{"role": "assistant", "content": text}] + list(new_messages)
    if not result.done and out.finish_reason == "length" and req.max_new_tokens < sampling.max_new_tokens:
        ep.env.end(Outcome.CONTEXT_OVERFLOW)  # cut by the context, not by the budget


def _play_lockstep(episodes, generator, chat, sampling, group_id, seed) -> None:
    step = 0
    while True:
        active = [ep for ep in episodes if not ep.env.done]
        if not active:
            return
        requests = [
            (ep, r) for ep in active if (r := _request(ep, generator, sampling, group_id, seed, step)) is not None
        ]
        if not requests:
            continue
        t0 = time.perf_counter()
        try:
            outputs = generator.generate([r for _, r in requests], sampling)
        except GeneratorUnavailable:
            raise  # the whole group is re-issued elsewhere
        except Exception as exc:
            for ep, _ in requests:
                _failed(ep, exc)
            continue
        elapsed = (time.perf_counter() - t0) / len(requests)
        for (ep, req), out in zip(requests, outputs):
            _apply(ep, req, out, chat, sampling, elapsed)
        step += 1


def _play_independently(episodes, generator, chat, sampling, group_id, seed) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def play(ep: _Episode) -> None:
        step = 0
        while not ep.env.done:
            req = _request(ep, generator, sampling, group_id, seed, step)
            if req is None:
                return
            t0 = time.perf_counter()
            try:
                out = generator.generate([req], sampling)[0]
            except GeneratorUnavailable:
                raise
            except Exception as exc:
                _failed(ep, exc)
                return
            _apply(ep, req, out, chat, sampling, time.perf_counter() - t0)
            step += 1

    with ThreadPoolExecutor(len(episodes), thread_name_prefix=f"episode-{group_id}") as pool:
        for future in [pool.submit(play, ep) for ep in episodes]:
            future.result()  # GeneratorUnavailable: the group is re-issued (the other episodes finish first)
