"""Multi-turn rollouts: generator and environment alternate until the episode ends.

A group is n rollouts of one task under one interface state. With a blocking
engine they advance in lockstep, so every generation call is one batch (and
the shared prompt prefix is computed once, then served from vLLM's prefix
cache); with a continuous-batching engine each episode sends its next turn
as soon as its env step is done (``lockstep=False``).

An episode the system ends (a failed or refused generation request, the
episode's wall-clock deadline, an exception from the environment's own code)
still ends with a record, marked with its ``InfraFault``: the replay queue keeps
it out of every reward statistic. A lost generator replica is different: the
whole group is re-issued elsewhere (GeneratorUnavailable propagates).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from env_pool.base import Environment, EpisodeResult, Outcome
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.registry import category_of
from replay.control_messages import GroupStats
from replay.messages import InfraFault, Segment, Trajectory
from rollout.chat import ChatBuildError, ChatTokenizer
from rollout.generator import GenerationOutput, GenerationRequest, Generator, GeneratorUnavailable, SamplingConfig

MIN_NEW_TOKENS = 8  # below this much room left, the episode ends as context overflow


@dataclass
class _Episode:
    env: Environment
    index: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    prompt_length: int = 0
    generate_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    fault: InfraFault | None = None
    pin: int | None = None  # pinned episodes: the policy version of its first output, kept to the end

    @property
    def active(self) -> bool:
        return self.fault is None and not self.env.done

    def add(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


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
    deadline_s: float | None = None,
    pinned: bool = False,
    reference: bool = False,
) -> list[Trajectory]:
    """n rollouts of ``task_id``; each ends with a record, whatever happens.

    ``lockstep``: the episodes' turns go to the generator as one batch per step
    (a blocking engine serves the group together). False: each episode runs on
    its own thread and sends its next turn as soon as its env step is done, so
    with a continuous-batching engine no episode waits for its siblings' turns.
    ``deadline_s``: each episode's wall-clock budget; past it the episode ends as
    an infra fault of kind ``deadline`` (a generation call still waiting is left behind).
    ``pinned`` (trainer.episode_version=pinned): every turn of an episode on the policy version its
    first turn ran on (actors/generation/episode_pins.py); the generator is told when each is over.
    ``reference`` (trainer.reference_logprobs=generator): once the group is played, the generator scores
    each trajectory on its base model, the KL reference under LoRA, and the trajectory carries the
    scores (``Trajectory.reference_logprobs``; learner/engine.py then skips its reference forward).
    """
    if n < 1:
        raise ValueError(f"a group needs n >= 1 rollouts, got {n}")
    return run_episodes(
        make_env,
        generator,
        chat,
        [task_id] * n,
        sampling,
        interface,
        group_id,
        seed,
        stats,
        lockstep,
        deadline_s,
        pinned,
        reference,
    )


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
    deadline_s: float | None = None,
    pinned: bool = False,
    reference: bool = False,
) -> list[Trajectory]:
    """One episode per entry of ``task_ids`` (a group repeats one task; a frozen
    evaluation plays many tasks), played together as run_group describes: with a
    blocking engine every generation step of every episode is one batch."""
    if not task_ids:
        raise ValueError("run_episodes needs at least one task id")
    if deadline_s is not None and deadline_s <= 0:
        raise ValueError(f"an episode deadline must be > 0 seconds, got {deadline_s}")
    group_id = group_id or uuid.uuid4().hex[:12]
    start_version = generator.policy_version
    t_start = time.perf_counter()
    play = _Play(
        generator, chat, sampling, group_id, seed, None if deadline_s is None else t_start + deadline_s, pinned
    )
    episodes = []
    for i, task_id in enumerate(task_ids):
        ep = _Episode(env=make_env(), index=i)
        try:
            opening = ep.env.reset(task_id, interface)
        except Exception as exc:  # the env's own code (a benchmark's tool errors are replies, never raised)
            _fault(ep, "env_error", exc)
        if ep.active:
            try:
                ep.add(chat.prompt_ids(opening), 0)
            except ChatBuildError as exc:  # the model's template cannot take this conversation
                _fault(ep, "chat_template", exc)
        ep.prompt_length = len(ep.token_ids)
        episodes.append(ep)

    try:
        if lockstep:
            _play_lockstep(episodes, play)
        else:
            _play_independently(episodes, play)
        references = _reference_logprobs(episodes, generator, stats) if reference else {}
    except BaseException:
        # The group is lost (GeneratorUnavailable: re-issued), but what the generator made for it
        # was generated all the same: the caller reports it, so the token books count it lost.
        if stats is not None:
            stats.generated_tokens += sum(sum(ep.loss_mask) for ep in episodes)
        raise
    finally:
        if pinned:  # every episode is over, whatever ended it: the versions they held may go
            generator.end_episodes([_episode_id(play, ep) for ep in episodes])

    total = time.perf_counter() - t_start
    trajectories = []
    for ep, task_id in zip(episodes, task_ids):
        res = _result(ep, task_id)
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
            infra_fault=ep.fault,
            start_version=start_version,
            num_parse_errors=res.num_parse_errors,
            reference_logprobs=references.get(ep.index),
        )
        traj.validate()
        trajectories.append(traj)
        if stats is not None:
            stats.prompt_tokens += ep.prompt_tokens
            stats.cached_prompt_tokens += ep.cached_tokens
            stats.generated_tokens += traj.num_generated_tokens
            stats.generate_s += ep.generate_s
    return trajectories


def _reference_logprobs(
    episodes: list[_Episode], generator: Generator, stats: GroupStats | None
) -> dict[int, list[float]]:
    """Episode index -> the base model's log-prob of each of its tokens (0.0 where not generated), for
    every episode the policy played that the generator can score whole: one call for the group. An
    episode left out (an infra fault: it trains as a stand-in; or as long as the model's context,
    with no room for the one token a scoring request asks) has its reference forwarded by the learner.
    A replica that fails or times out raises (GeneratorUnavailable: the group is re-issued)."""
    played = [ep for ep in episodes if ep.fault is None]
    # One that generated nothing scores nothing: zeros, never read, so its micro-batch needs no forward either.
    out = {ep.index: [0.0] * len(ep.token_ids) for ep in played if not any(ep.loss_mask)}
    scored = [ep for ep in played if any(ep.loss_mask) and len(ep.token_ids) < generator.max_model_len]
    if not scored:
        return out
    t0 = time.perf_counter()
    answers = generator.reference_logprobs([ep.token_ids for ep in scored])
    if stats is not None:
        stats.reference_s += time.perf_counter() - t0
        stats.reference_tokens += sum(len(ep.token_ids) for ep in scored)
    for ep, lps in zip(scored, answers, strict=True):
        if len(lps) != len(ep.token_ids) - 1:
            raise ValueError(f"{len(lps)} reference log-probs for the {len(ep.token_ids) - 1} tokens after the first")
        out[ep.index] = [0.0] + [lp if m else 0.0 for m, lp in zip(ep.loss_mask[1:], lps)]
    return out


@dataclass(frozen=True)
class _Play:
    """What every turn of one group's episodes shares."""

    generator: Generator
    chat: ChatTokenizer
    sampling: SamplingConfig
    group_id: str
    seed: int | None
    deadline: float | None  # perf_counter() past which an episode ends as an infra fault; None: no budget
    pinned: bool = False  # trainer.episode_version=pinned: each episode on one policy version

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        """The generator's outputs, or _DeadlinePassed once the episodes' budget is spent
        (the call then goes on in the background; its output is never read)."""
        if self.deadline is None:
            return self.generator.generate(requests, self.sampling)
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise _DeadlinePassed()
        box: dict[str, object] = {}

        def call() -> None:
            try:
                box["out"] = self.generator.generate(requests, self.sampling)
            except BaseException as exc:  # handed to the episode's thread below
                box["exc"] = exc

        worker = threading.Thread(target=call, name=f"generate-{self.group_id}", daemon=True)
        worker.start()
        worker.join(left)
        if worker.is_alive():
            raise _DeadlinePassed()
        if "exc" in box:
            raise box["exc"]  # type: ignore[misc]
        return box["out"]  # type: ignore[return-value]  # call() put the generator's outputs there


class _DeadlinePassed(Exception):
    """The episode's wall-clock budget (trainer.episode_deadline_s) ran out."""


def _request(ep: _Episode, play: _Play, step: int) -> GenerationRequest | None:
    """The episode's next generation request, or None when no room is left (the episode ends)."""
    room = play.generator.max_model_len - len(ep.token_ids)
    if room < MIN_NEW_TOKENS:
        ep.env.end(Outcome.CONTEXT_OVERFLOW)
        return None
    req_seed = None if play.seed is None else play.seed * 1_000_003 + ep.index * 1009 + step
    return GenerationRequest(
        f"{play.group_id}-{ep.index}-{step}",
        ep.token_ids,
        min(play.sampling.max_new_tokens, room),
        req_seed,
        episode_id=_episode_id(play, ep) if play.pinned else None,
        pin_version=ep.pin,
    )


def _episode_id(play: _Play, ep: _Episode) -> str:
    return f"{play.group_id}-{ep.index}"


def _fault(ep: _Episode, kind: str, exc: BaseException | None) -> None:
    """The system ended the episode: marked (never a reward of the policy), the env told where it can be."""
    cause = getattr(exc, "cause", None)  # a remote generator's error (Ray's RayTaskError) names its cause
    exc = cause if isinstance(cause, BaseException) else exc
    message = "past its wall-clock deadline" if exc is None else f"{exc.__class__.__name__}: {exc}"
    ep.fault = InfraFault(kind, " ".join(message.split())[:500])
    try:
        ep.env.end(Outcome.ABORTED)
    except Exception:  # an env whose own code raised may not end cleanly; the record says why
        pass


def _generation_failed(ep: _Episode, exc: Exception) -> None:
    """A generation request that failed: refused by the engine (a bad request: ValueError,
    TypeError, also as Ray's wrapped cause) or an engine error on the request."""
    if isinstance(exc, _DeadlinePassed):
        _fault(ep, "deadline", None)
    else:
        _fault(ep, "engine_rejected" if isinstance(exc, (ValueError, TypeError)) else "generation_error", exc)


def _result(ep: _Episode, task_id: str) -> EpisodeResult:
    """The env's verdict; for an episode the env's own code broke, a placeholder (an infra fault
    is never scored: the replay queue keeps it out of every statistic)."""
    try:
        return ep.env.result()
    except Exception:
        if ep.fault is None:
            raise

    try:
        category = category_of(task_id)
    except Exception:  # an id no registry knows: the env's own naming is broken too
        category = "unknown"
    return EpisodeResult(
        env=ep.env.kind,
        task_id=task_id,
        category=category,
        reward=0,
        success=False,
        progress=0.0,
        tags=[],
        labels=[],
        error_type=None,
        outcome=Outcome.ABORTED.value,
        interface_version=0,
        num_steps=0,
        num_tool_calls=0,
        num_parse_errors=0,
        turns=[],
        env_seconds=0.0,
        judge_seconds=0.0,
    )


def _apply(ep: _Episode, req: GenerationRequest, out: GenerationOutput, play: _Play, elapsed: float) -> None:
    """One generated turn into the episode: its tokens (a segment per policy version), the env's step, the reply."""
    chat, sampling = play.chat, play.sampling
    ep.generate_s += elapsed
    ep.prompt_tokens += out.prompt_tokens
    ep.cached_tokens += out.cached_prompt_tokens
    start = len(ep.token_ids)
    if play.pinned and ep.pin is None:
        ep.pin = out.policy_version  # the replica pinned the episode to the version of its first turn
    ep.add(out.token_ids, 1, out.logprobs)
    ep.segments.extend(Segment(start + s.start, start + s.end, s.policy_version) for s in out.version_spans())
    turn = chat.completion(out.token_ids)
    try:
        result = ep.env.step(turn.text)
    except Exception as exc:  # the env's own code raised: the system's fault, not the policy's
        _fault(ep, "env_error", exc)
        return
    try:
        ep.add(chat.continuation_ids(turn.ended, [] if result.done else result.messages), 0)
    except ChatBuildError as exc:  # the model's template cannot take the env's reply: not the policy's doing
        _fault(ep, "chat_template", exc)
        return
    if not result.done and out.finish_reason == "length" and req.max_new_tokens < sampling.max_new_tokens:
        ep.env.end(Outcome.CONTEXT_OVERFLOW)  # cut by the context, not by the budget


def _play_lockstep(episodes: list[_Episode], play: _Play) -> None:
    step = 0
    while True:
        active = [ep for ep in episodes if ep.active]
        if not active:
            return
        requests = [(ep, r) for ep in active if (r := _request(ep, play, step)) is not None]
        if not requests:
            continue
        t0 = time.perf_counter()
        try:
            outputs = play.generate([r for _, r in requests])
        except GeneratorUnavailable:
            raise  # the whole group is re-issued elsewhere
        except Exception as exc:
            for ep, _ in requests:
                _generation_failed(ep, exc)
            continue
        elapsed = (time.perf_counter() - t0) / len(requests)
        for (ep, req), out in zip(requests, outputs):
            _apply(ep, req, out, play, elapsed)
        step += 1


def _play_independently(episodes: list[_Episode], play: _Play) -> None:
    def run(ep: _Episode) -> None:
        step = 0
        while ep.active:
            req = _request(ep, play, step)
            if req is None:
                return
            t0 = time.perf_counter()
            try:
                out = play.generate([req])[0]
            except GeneratorUnavailable:
                raise
            except Exception as exc:
                _generation_failed(ep, exc)
                return
            _apply(ep, req, out, play, time.perf_counter() - t0)
            step += 1

    with ThreadPoolExecutor(len(episodes), thread_name_prefix=f"episode-{play.group_id}") as pool:
        for future in [pool.submit(run, ep) for ep in episodes]:
            future.result()  # GeneratorUnavailable: the group is re-issued (the other episodes finish first)
