"""Running the OOD harness views (evaluation/ood_views.py) for one snapshot.

The snapshot's generator (the VllmGenerator the other views use) serves
every participant through ``evaluation.ood_backend.GeneratorChat`` with the
evaluation sampling (temperature 0): for tau2 it sits behind one local
OpenAI-compatible endpoint as both the agent and the user simulator; for
BFCL memory it is the tool agent directly. Each task becomes one TaskResult:

- tau2: success / reward from tau2's evaluator; tool calls are the agent's;
  tokens are the agent's (generated: every reply; prompt: the final context
  less the generated tokens, as for the other views); the user simulator's
  tokens are not counted. tau2's termination maps to an outcome
  (``TAU2_OUTCOMES``) and its process error stays the process error;
- memory: a question's first run plays its scenario's prerequisite chain
  with the same model (once per scenario and snapshot; its tokens and calls
  are not charged to the question), then the question, scored by bfcl-eval's
  checker; the episode's outcome is kept.

The harness's own record of each run (tau2 termination, simulator model,
user-side tokens, memory verdict) is appended to ``details`` as JSON lines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from env_pool.ood import bfcl_memory as M
from env_pool.ood import tau2
from env_pool.ood.openai_server import ChatServer
from evaluation.ood_backend import GeneratorChat, tool_agent
from evaluation.ood_views import HARNESS_KEY, split_tau2_id
from evaluation.records import TaskResult
from rollout.generator import GeneratorUnavailable, SamplingConfig

AGENT_NAME, USER_NAME = "seal-policy", "seal-user-simulator"  # model names on the local endpoint
TAU2_OUTCOMES = {
    "user_stop": "completed",
    "agent_stop": "completed",
    "max_steps": "step_limit",
    "context_overflow": "context_overflow",
    "too_many_errors": "aborted",
    "agent_error": "aborted",
    "user_error": "aborted",
    "process_error": "aborted",
}


class TokenCounter:
    """A generate callable that counts what passes through it."""

    def __init__(self, generate: Any) -> None:
        self.generate = generate
        self.reset()

    def reset(self) -> None:
        self.requests = self.generated = self.last_context = 0

    def __call__(self, messages, tools, temperature, max_tokens):
        reply = self.generate(messages, tools, temperature, max_tokens)
        self.requests += 1
        self.generated += reply.completion_tokens
        self.last_context = reply.prompt_tokens + reply.completion_tokens
        return reply

    def prompt_tokens(self) -> int:
        return max(0, self.last_context - self.generated)


class OodRunner:
    """Harness tasks of one snapshot; endpoint and memory runs open lazily,
    ``close`` ends them (call it before the generator is closed)."""

    def __init__(self, generator: Any, sampling: Any, *, snapshot: str, seed: int, details: Path | None = None) -> None:
        self.generator, self.sampling, self.snapshot, self.seed = generator, sampling, snapshot, seed
        self.details = details
        self._agent: TokenCounter | None = None
        self._user: TokenCounter | None = None
        self._server: ChatServer | None = None
        self._memory: dict[str, Any] = {}  # backend -> MemoryRun of this snapshot
        self._played: dict[str, set[str]] = {}  # backend -> scenarios whose chain this snapshot played

    def _chat(self) -> tuple[TokenCounter, TokenCounter]:
        if self._agent is None or self._user is None:
            s = self.sampling
            chat = GeneratorChat(
                self.generator,
                SamplingConfig(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens),
                seed=self.seed,
            )
            self._agent, self._user = TokenCounter(chat), TokenCounter(chat)
        return self._agent, self._user

    def run(self, env: Mapping[str, Any], view: str, task_id: str) -> TaskResult:
        t0 = time.perf_counter()
        harness = env[HARNESS_KEY]
        try:
            if harness == "tau2":
                result, detail = self._tau2(env, view, task_id)
            elif harness == "bfcl_memory":
                result, detail = self._memory_question(env, view, task_id)
            else:
                raise ValueError(f"unknown OOD harness {harness!r}")
        except Exception as exc:  # the harness itself failed: a process error, never a policy verdict
            if isinstance(exc, GeneratorUnavailable):
                raise
            category = env.get("domain") or env.get("backend") or "unknown"
            result = TaskResult(
                self.snapshot,
                view,
                task_id,
                category,
                False,
                0.0,
                0,
                0,
                0,
                time.perf_counter() - t0,
                process_error=f"crash: {exc.__class__.__name__}: {exc}",
                outcome="aborted",
            )
            detail = {"crash": result.process_error}
        self._write(view, task_id, detail)
        return result

    def _tau2(self, env: Mapping[str, Any], view: str, task_id: str) -> tuple[TaskResult, dict]:
        domain, tid = split_tau2_id(task_id)
        if domain != env["domain"]:
            raise ValueError(f"task {task_id} is not in the {env['domain']} domain")
        agent, user = self._chat()
        if self._server is None:
            self._server = ChatServer({AGENT_NAME: agent, USER_NAME: user})
        agent.reset()
        user.reset()
        r = tau2.run_episode(
            domain,
            tid,
            AGENT_NAME,
            USER_NAME,
            self._server.base_url,
            temperature=0.0,
            user_temperature=0.0,
            max_steps=int(env["max_steps"]),
            max_errors=int(env["max_errors"]),
            seed=self.seed,
        )
        result = TaskResult(
            self.snapshot,
            view,
            task_id,
            domain,
            r.success,
            r.reward,
            r.agent_tool_calls,
            agent.generated,
            agent.prompt_tokens(),
            r.seconds,
            process_error=r.process_error,
            outcome=TAU2_OUTCOMES.get(r.termination, "aborted"),
        )
        detail = {k: v for k, v in r.to_dict().items() if k != "comparability"}
        detail.update(agent_requests=agent.requests, user_requests=user.requests, user_generated_tokens=user.generated)
        return result, detail

    def _memory_question(self, env: Mapping[str, Any], view: str, task_id: str) -> tuple[TaskResult, dict]:
        backend = env["backend"]
        agent_chat, _ = self._chat()
        agent = tool_agent(agent_chat)
        run = self._memory.get(backend)
        if run is None:
            run = self._memory[backend] = M.MemoryRun(backend)
        question = run.data.question(task_id)
        played = self._played.setdefault(backend, set())
        prereq = {}
        if question.scenario not in played:
            t0 = time.perf_counter()
            episodes = [M.run_entry(run, e, agent) for e in run.data.prereqs_of(question.scenario)]
            played.add(question.scenario)
            prereq = {
                "prereq_entries": len(episodes),
                "prereq_tool_calls": sum(e.tool_calls for e in episodes),
                "prereq_outcomes": [e.outcome for e in episodes],
                "prereq_s": time.perf_counter() - t0,
            }
        agent_chat.reset()
        t0 = time.perf_counter()
        episode = M.run_entry(run, question, agent, env.get("max_steps"))
        score = M.score_episode(run, episode)
        result = TaskResult(
            self.snapshot,
            view,
            task_id,
            backend,
            score.valid,
            float(score.valid),
            episode.tool_calls,
            agent_chat.generated,
            agent_chat.prompt_tokens(),
            time.perf_counter() - t0,
            outcome=episode.outcome,
        )
        return result, {**score.to_dict(), **episode.to_dict(), **prereq}

    def _write(self, view: str, task_id: str, detail: dict) -> None:
        if self.details is None:
            return
        self.details.parent.mkdir(parents=True, exist_ok=True)
        with open(self.details, "a") as f:
            # the harness's own task id (tau2's "0") stays as harness_task_id; ours is the view's
            row = {
                **{("harness_task_id" if k == "task_id" else k): v for k, v in detail.items()},
                "snapshot": self.snapshot,
                "view": view,
                "task_id": task_id,
            }
            f.write(json.dumps(row, default=str) + "\n")

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for run in self._memory.values():
            run.close()
        self._memory.clear()
