"""bfcl-eval's own verdict on a decoded trajectory, for cross-checking ours.

This runs ``multi_turn_checker`` as eval_runner does (force-termination
check, then the checker), on call strings rendered from our strictly parsed
calls: tool names of the task only, literal arguments, and "(" inside strings
written as an escape so bfcl-eval's call-rewriting regex cannot alter string
text. The instances it keeps in module globals are removed afterwards.

Used by tests and by ``seal env score --official``; training uses judge.py.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

from env_pool import tags as T
from env_pool.bfcl.runtime import isolate_shared_state, method_class, prepare_import
from env_pool.bfcl.tasks import BfclTask
from env_pool.tool_calls import ParsedStep, ToolCall, python_literal

_ids = itertools.count()


def call_string(call: ToolCall) -> str:
    args = ", ".join(f"{k}={python_literal(v, escape_parens=True)}" for k, v in call.arguments.items())
    return f"{call.name}({args})"


def official_verdict(task: BfclTask, turns: Sequence[Sequence[ParsedStep]]) -> tuple[bool, str | None]:
    """(valid, error_type) exactly as bfcl-eval's eval_runner would report."""
    if len(turns) != task.num_turns:
        return False, T.ERR_FORCE_TERMINATED
    decoded: list[list[list[str]]] = []
    for steps in turns:
        turn: list[list[str]] = []
        for s in steps:
            if s.error is None and s.calls:
                for c in s.calls:
                    if method_class(task.involved_classes, c.name) is None:
                        raise ValueError(f"refusing to send unknown tool {c.name!r} to bfcl-eval's eval()")
                turn.append([call_string(c) for c in s.calls])
        decoded.append(turn)

    prepare_import()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    model_name = f"seal_official_{os.getpid()}_{next(_ids)}"
    entry = {"id": task.id, "initial_config": task.initial_config, "involved_classes": list(task.involved_classes)}
    try:
        if task.long_context:
            # Pre-create both instance sets (the checker reuses them from its
            # globals) with private copies of long_context's shared module data.
            for suffix in ("", "_ground_truth"):
                _, instances = multi_turn_utils.execute_multi_turn_func_call(
                    [],
                    task.initial_config,
                    list(task.involved_classes),
                    model_name + suffix,
                    task.id,
                    long_context=True,
                    is_evaL_run=True,
                )
                for inst in instances.values():
                    isolate_shared_state(inst)
        result = multi_turn_checker(decoded, [list(t) for t in task.ground_truth], entry, task.category, model_name)
    finally:
        g = vars(multi_turn_utils)
        for key in [k for k in g if k.startswith(model_name)]:
            del g[key]
    if result["valid"]:
        return True, None
    return False, result.get("error_type")
