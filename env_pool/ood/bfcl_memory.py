"""BFCL V4 Memory with the kv and rec_sum backends, offline.

Reported as "BFCL V4 Memory (kv + rec_sum)", never as the full Memory score:
the vector backend needs embedding weights from a model hub.

The benchmark, as bfcl-eval runs it: per scenario (customer, student, ...),
prerequisite conversations are played in order, the agent managing its
memory through the backend's tools; at the end of each one the backend is
flushed to a snapshot file. Each question then starts from the scenario's
final snapshot (its core memory shown in the system prompt), the agent may
call memory tools, and its last message that is not a call is checked by
bfcl-eval's ``agentic_checker`` against the possible answers.

What comes from bfcl-eval: the data and ids (``load_dataset_entry``), the
snapshot chain (each backend's ``_load_scenario`` / ``_flush_memory_to_local_file``
under a run directory of ours), the system prompt
(``add_memory_instruction_system_prompt``), the step limit and the checker.
What is ours: calls are decoded by our strict ``<tool_call>`` JSON parser and
dispatched directly to the backend's methods (env_pool/bfcl/runtime.py), never
through bfcl-eval's eval of call strings. A step that decodes to no call ends
the turn, as in bfcl-eval's inference loop.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from env_pool.base import Outcome
from env_pool.bfcl.runtime import ExecCall, InstanceSet, is_error_result, prepare_import
from env_pool.ood import MEMORY_LABEL
from env_pool.ood.openai_server import PromptTooLong
from env_pool.tool_calls import ToolCall, parse_step, render_calls

BACKENDS: tuple[str, ...] = ("kv", "rec_sum")
LABEL = MEMORY_LABEL
Message = dict[str, Any]
# messages so far, tool docs (BFCL function-doc dicts) -> the next assistant step
Agent = Callable[[list[Message], list[dict[str, Any]]], str]


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"memory backend {backend!r} is not available offline; expected one of {BACKENDS}")


@dataclass(frozen=True)
class MemoryEntry:
    id: str  # bfcl-eval's id: memory_kv_prereq_0-customer-0, memory_kv_0-customer-0, ...
    scenario: str
    prereq: bool
    turns: tuple[
        tuple[Message, ...], ...
    ]  # user turns; a question's first turn opens with the answer-format system message
    answers: tuple[str, ...] = ()  # possible answers (questions only)


@dataclass(frozen=True)
class MemoryData:
    backend: str
    class_name: str
    tools: tuple[dict[str, Any], ...]
    prereqs: tuple[MemoryEntry, ...]  # in bfcl-eval's order; within a scenario, the chain order
    questions: tuple[MemoryEntry, ...]

    def prereqs_of(self, scenario: str) -> list[MemoryEntry]:
        return [e for e in self.prereqs if e.scenario == scenario]

    def question(self, question_id: str) -> MemoryEntry:
        for q in self.questions:
            if q.id == question_id:
                return q
        raise KeyError(f"no {self.backend} memory question {question_id!r}")


@cache
def load(backend: str) -> MemoryData:
    _check_backend(backend)
    prepare_import()
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    category = f"memory_{backend}"
    entries = load_dataset_entry(category)
    # Ground-truth ids carry no backend (memory_0-customer-0); questions' do.
    answers = {
        g["id"].replace("memory_", f"{category}_", 1): tuple(g["ground_truth"])
        for g in load_ground_truth_entry(category)
    }
    prereqs, questions = [], []
    for e in entries:
        turns = tuple(tuple(m for m in turn) for turn in e["question"])
        if "prereq" in e["id"]:
            prereqs.append(MemoryEntry(e["id"], e["scenario"], True, turns))
        else:
            questions.append(MemoryEntry(e["id"], e["scenario"], False, turns, answers[e["id"]]))
    (class_name,) = entries[0]["involved_classes"]
    return MemoryData(backend, class_name, tuple(entries[0]["function"]), tuple(prereqs), tuple(questions))


class MemoryRun:
    """One agent's pass over a backend. Snapshots live under ``root`` (a
    fresh temporary directory unless given), laid out as bfcl-eval lays out a
    model's result directory. The chain order is enforced: a scenario's
    prerequisite k needs 0..k-1 done, a question needs them all."""

    def __init__(self, backend: str, root: str | Path | None = None) -> None:
        self.data = load(backend)
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix=f"seal-memory-{backend}-")) if root is None else Path(root)
        self.done: set[str] = set()

    def open(self, entry: MemoryEntry) -> MemorySession:
        chain = self.data.prereqs_of(entry.scenario)
        needed = chain[: chain.index(entry)] if entry.prereq else chain
        missing = [e.id for e in needed if e.id not in self.done]
        if missing:
            raise RuntimeError(f"{entry.id} needs the prerequisite conversations {missing} first")
        return MemorySession(self, entry)

    def close(self) -> None:
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MemoryRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MemorySession:
    """One entry's backend instance, loaded from the snapshot chain."""

    def __init__(self, run: MemoryRun, entry: MemoryEntry) -> None:
        from bfcl_eval.model_handler.utils import add_memory_instruction_system_prompt
        from bfcl_eval.utils import populate_initial_settings_for_memory_test_cases

        self.run, self.entry, data = run, entry, run.data
        spec = {"id": entry.id, "scenario": entry.scenario, "involved_classes": [data.class_name]}
        config = populate_initial_settings_for_memory_test_cases([spec], run.root)[0]["initial_config"]
        self._instances = InstanceSet(config, [data.class_name], long_context=False)
        self.backend = self._instances.instances[data.class_name]
        turns = [list(copy.deepcopy(t)) for t in entry.turns]
        # The system prompt shows the memory as loaded now (core memory / summary).
        self.turns = add_memory_instruction_system_prompt(turns, f"memory_{data.backend}", entry.scenario, self.backend)
        self.tool_names = frozenset(t["name"] for t in data.tools)

    def execute(self, call: ToolCall) -> str:
        if call.name not in self.tool_names:
            return f"Error during execution: {call.name!r} is not a memory tool"
        return self._instances.execute(ExecCall(call.name, (), dict(call.arguments)))

    def finish(self) -> None:
        # bfcl-eval flushes after every prerequisite conversation, whatever
        # happened in it; questions never write the chain.
        if self.entry.prereq:
            self.backend._flush_memory_to_local_file()
            self.run.done.add(self.entry.id)


@dataclass(frozen=True)
class MemoryEpisode:
    entry_id: str
    backend: str
    steps: list[list[str]]  # assistant step texts per user turn
    tool_calls: int
    tool_errors: int
    parse_errors: int  # steps that tried a call and failed to decode (they end the turn)
    outcome: str  # completed | step_limit (bfcl-eval's forced quit) | context_overflow (the agent's model is full)
    messages: list[Message] = field(repr=False, default_factory=list)

    @property
    def forced_quit(self) -> bool:
        return self.outcome == Outcome.STEP_LIMIT.value

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("messages")
        return out


def step_limit() -> int:
    prepare_import()
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

    return int(MAXIMUM_STEP_LIMIT)


def run_entry(run: MemoryRun, entry: MemoryEntry, agent: Agent, max_steps: int | None = None) -> MemoryEpisode:
    """Play one prerequisite conversation or question with ``agent``."""
    limit = step_limit() if max_steps is None else max_steps
    session = run.open(entry)
    tools = list(run.data.tools)
    messages: list[Message] = []
    steps: list[list[str]] = []
    calls = errors = parse_errors = 0
    outcome = Outcome.COMPLETED
    for turn in session.turns:
        messages.extend(copy.deepcopy(turn))
        texts: list[str] = []
        count = 0
        while True:
            try:
                text = agent(copy.deepcopy(messages), tools)
            except PromptTooLong:
                outcome = Outcome.CONTEXT_OVERFLOW  # a named end, as in our BFCL env
                break
            texts.append(text)
            messages.append({"role": "assistant", "content": text})
            parsed = parse_step(text, "json")
            parse_errors += parsed.error is not None
            if not parsed.has_calls:
                break  # prose or an undecodable step ends the turn (bfcl-eval)
            for call in parsed.calls:
                result = session.execute(call)
                calls += 1
                errors += is_error_result(result)
                messages.append({"role": "tool", "name": call.name, "content": result})
            count += 1
            if count > limit:
                outcome = Outcome.STEP_LIMIT
                break
        steps.append(texts)
        if outcome is not Outcome.COMPLETED:
            break
    session.finish()
    return MemoryEpisode(entry.id, run.data.backend, steps, calls, errors, parse_errors, outcome.value, messages)


@dataclass(frozen=True)
class MemoryScore:
    question_id: str
    backend: str
    valid: bool
    final_message: str | None  # the last step that is not a call: what the checker reads
    error_type: str | None = None
    label: str = LABEL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_steps(question: MemoryEntry, steps: Sequence[str], backend: str) -> MemoryScore:
    """bfcl-eval's agentic verdict on one question's assistant steps."""
    if question.prereq:
        raise ValueError(f"{question.id} is a prerequisite conversation: nothing to score")
    prepare_import()
    from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

    last = None
    for text in steps:
        if not parse_step(text, "json").has_calls:
            last = text
    if not last:
        return MemoryScore(question.id, backend, False, last, "agentic:no_last_message")
    verdict = agentic_checker(last, list(question.answers))
    return MemoryScore(question.id, backend, bool(verdict["valid"]), last, verdict.get("error_type"))


def score_episode(run: MemoryRun, episode: MemoryEpisode) -> MemoryScore:
    question = run.data.question(episode.entry_id)
    return score_steps(question, [s for turn in episode.steps for s in turn], run.data.backend)


@dataclass(frozen=True)
class BackendResult:
    backend: str
    scores: list[MemoryScore]
    prereq_episodes: list[MemoryEpisode]
    question_episodes: list[MemoryEpisode]
    label: str = LABEL

    @property
    def accuracy(self) -> float:
        return sum(s.valid for s in self.scores) / len(self.scores) if self.scores else 0.0


def run_backend(
    backend: str,
    agent: Callable[[str], Agent],
    root: str | Path | None = None,
    question_ids: Sequence[str] | None = None,
) -> BackendResult:
    """The benchmark on one backend: per scenario, the prerequisite chain,
    then its questions, each scored. ``agent(entry_id)`` gives the agent for
    an entry (one callable may serve all: ``lambda _: my_agent``)."""
    with MemoryRun(backend, root) as run:
        wanted = set(question_ids) if question_ids is not None else None
        questions = [q for q in run.data.questions if wanted is None or q.id in wanted]
        prereqs, episodes, scores = [], [], []
        for scenario in dict.fromkeys(q.scenario for q in questions):
            prereqs += [run_entry(run, e, agent(e.id)) for e in run.data.prereqs_of(scenario)]
            for q in (q for q in questions if q.scenario == scenario):
                episodes.append(run_entry(run, q, agent(q.id)))
                scores.append(score_episode(run, episodes[-1]))
        return BackendResult(backend, scores, prereqs, episodes)


# ------------------------------------------------------- reference agents
# Model-free agents for checks: one that writes every user message into
# memory, one that reads the whole memory back and then gives an answer.
_KV_VALUE_MAX = 2000  # bfcl's archival entry limit (memory_kv.MAX_ARCHIVAL_MEMORY_ENTRY_LENGTH)


def note_taker(backend: str) -> Agent:
    """Stores each user message verbatim, then replies "Noted." (ends the turn)."""
    _check_backend(backend)
    written = [0]  # keys must be unique across the whole chain: count every note

    def agent(messages: list[Message], tools: list[dict]) -> str:
        if messages[-1]["role"] == "tool":
            return "Noted."
        text = messages[-1]["content"]
        if backend == "kv":
            written[0] += 1
            call = ToolCall("archival_memory_add", {"key": f"note_{written[0]}", "value": text[:_KV_VALUE_MAX]})
        else:
            call = ToolCall("memory_append", {"text": text + "\n"})
        return render_calls([call], "json")

    return agent


def memory_reader(backend: str, answer: str | None) -> Agent:
    """Reads the memory through the tools (kv: list the archival keys, then
    retrieve them all; rec_sum: retrieve), then answers in the required
    format; ``answer=None`` stops after reading, with a call as last step."""
    _check_backend(backend)

    def agent(messages: list[Message], tools: list[dict]) -> str:
        results = [m for m in messages if m["role"] == "tool"]
        if backend == "kv" and not results:
            return render_calls([ToolCall("archival_memory_list_keys", {})], "json")
        if backend == "kv" and len(results) == 1:
            keys = json.loads(results[0]["content"])["keys"]
            if keys:
                return render_calls([ToolCall("archival_memory_retrieve", {"key": k}) for k in keys], "json")
        if backend == "rec_sum" and not results:
            return render_calls([ToolCall("memory_retrieve", {})], "json")
        if answer is None:
            return render_calls(
                [ToolCall("memory_retrieve" if backend == "rec_sum" else "core_memory_list_keys", {})], "json"
            )
        return f"{{'answer': {answer!r}, 'context': 'from memory'}}"

    return agent


def play_prereqs(run: MemoryRun, scenario: str, agent: Agent) -> list[MemoryEpisode]:
    return [run_entry(run, e, agent) for e in run.data.prereqs_of(scenario)]


def retrieved_text(episode: MemoryEpisode) -> str:
    """Every tool result the agent saw: what it could have read from memory."""
    return "\n".join(m["content"] for m in episode.messages if m["role"] == "tool")
