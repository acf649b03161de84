"""ThermostatEnv: a complete environment of one's own, with SEAL's full diagnosis vocabulary.

docs/custom-environment.md walks through it; examples/minimal/ is the smallest one. What the
environment supplies on top of env_pool's ToolEnv (the system prompt, the executor with the
interface's error hints, the user turns and the reference come from it):

- its tasks and tools (examples/thermostat/tasks.py), the home each episode plays in (``new_state``);
- the verifier (``judge``): a binary reward from the end state and the tool results, and one
  diagnosis tag per user turn in both vocabularies of env_pool/tags.py, which drive the A-Patch
  weights, the capability state and the guidelines.

Select it with ``seal train env=thermostat`` (configs/env/thermostat.yaml); this folder must be
importable by every process of the run (``PYTHONPATH=$PWD``, run from the repository root).
"""

from __future__ import annotations

from collections.abc import Sequence

from env_pool import tags as T
from env_pool.base import Outcome
from env_pool.multi_turn import Verdict
from env_pool.paper_labels import paper_label
from env_pool.tool_calls import ParsedStep, ToolCall
from env_pool.tool_env import ToolEnv
from env_pool.tool_functions import is_error_result
from examples.thermostat.tasks import SPLITS, TOOLS, Home, ThermostatTask, get_task


def verdict(task: ThermostatTask, turns: Sequence[Sequence[ParsedStep]], cut_off: bool) -> Verdict:
    """Replay the model's decoded calls and the ground truth's in two homes, turn by turn, without
    stopping at the first failure. A turn with expected calls passes when both homes agree (state)
    and every ground-truth result is among the model's results so far (response). A turn the episode
    never reached (``cut_off``: the step limit or the context ended it) is diagnosed as empty."""
    model, truth = Home(dict(task.initial)), Home(dict(task.initial))
    model_results: list[str] = []
    tags: list[str] = []
    labels: list[str] = []
    error_type = T.ERR_FORCE_TERMINATED if cut_off else None
    for t, turn in enumerate(task.turns):
        steps = turns[t] if t < len(turns) else ()
        calls = [c for s in steps if s.error is None for c in s.calls]
        results = [TOOLS.execute(c, model) for c in calls]
        model_results += results
        gt_results = [TOOLS.execute(c, truth) for c in turn.expected]
        state_ok = response_ok = None
        if not turn.expected:
            tag = T.SPURIOUS_TOOL_CALL if calls else T.CORRECT_ABSTENTION
        elif not calls:
            tag = T.EMPTY_TURN
        else:
            state_ok = model.temperatures == truth.temperatures
            response_ok = all(r in model_results for r in gt_results)
            tag = T.PASS if state_ok and response_ok else T.STATE_MISMATCH if not state_ok else T.RESPONSE_MISMATCH
        if error_type is None and tag in (T.EMPTY_TURN, T.STATE_MISMATCH, T.RESPONSE_MISMATCH):
            error_type = {T.EMPTY_TURN: T.ERR_EMPTY_TURN, T.STATE_MISMATCH: T.ERR_STATE}.get(tag, T.ERR_RESPONSE)
        tags.append(tag)
        label = paper_label(
            steps=steps,
            calls=calls,
            expected=turn.expected,
            results=results,
            state_ok=state_ok,
            response_ok=response_ok,
            tag=tag,
            visible=TOOLS.by_name,
            is_error=is_error_result,
        )
        labels.append(label)
    passed = sum(tag in T.PASSING_TAGS for tag in tags)
    return Verdict(int(error_type is None), passed / len(tags), tuple(tags), tuple(labels), error_type)


class ThermostatEnv(ToolEnv[ThermostatTask]):
    kind = "thermostat"  # names the environment in trajectories, metrics and errors
    splits = SPLITS  # task ids and their prefix (env_pool/registry.py finds the env by it)
    tools = TOOLS
    intro = "You control a home's thermostats."
    example = ToolCall("get_temperature", {"room": "kitchen"})  # the call the system prompt shows

    @classmethod
    def task_of(cls, task_id: str) -> ThermostatTask:
        return get_task(task_id)

    def new_state(self, task: ThermostatTask) -> Home:
        return Home(dict(task.initial))

    def judge(self) -> Verdict:
        return verdict(self.task, self.parsed_turns, cut_off=self.outcome != Outcome.COMPLETED)
