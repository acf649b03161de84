"""`seal env ...`: replay ground truth, score trajectory files, show prompts, on every registered
env (env_pool/registry.py). The env is the one a task id names (its prefix), else ``env=NAME``
among the overrides, else the configs' default (the env `seal train` trains on); its settings
(tool format, step limit) are the configs' own, ``--format`` and overrides on top."""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from env_pool.base import play_scripted
from env_pool.bfcl.judge import judge
from env_pool.bfcl.official import official_verdict
from env_pool.bfcl.runtime import call_signatures
from env_pool.bfcl.tasks import get_task
from env_pool.interface.state import RAW_INTERFACE
from env_pool.registry import category_of, env_kind
from env_pool.tool_calls import parse_step
from seal.config import compose, instantiate
from seal.config_paths import unimportable
from seal.errors import CliError


def _interface(components: str, guidelines: str = ""):
    state = RAW_INTERFACE.with_components(components) if components else RAW_INTERFACE
    if guidelines:
        kinds = tuple(k.strip() for k in guidelines.split(",") if k.strip())
        state = replace(state, guidelines=True, active_guidelines=kinds)
    return state


def env_for(args, task_id: str | None = None, **settings: Any):
    """The env ``args`` ask for: ``env=NAME`` among the overrides, else the env ``task_id`` belongs to,
    else the configs' default; ``--format`` (when given) and ``settings`` on its config."""
    overrides = list(getattr(args, "overrides", []) or [])
    named = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == "env"]
    if task_id is not None and not named:
        try:
            overrides.append(f"env={env_kind(task_id)}")
        except KeyError as exc:  # no env imported here has such ids: one of the user's needs naming
            raise CliError(f"{exc.args[0]}; an env of your own: add env=NAME or env=path/to/its.yaml") from None
    node = compose(overrides).env  # an unknown env=NAME: one line naming the options
    module, _, name = str(node._target_).rpartition(".")
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise CliError(unimportable(str(node._target_), exc)) from None
    if getattr(args, "tool_format", None):
        node.tool_format = args.tool_format
    for key, value in settings.items():
        node[key] = value
    env = instantiate(node)
    # Checked once the named env is built: an env from outside env_pool is known by its class.
    if task_id is not None and named and (kind := env_kind(task_id)) != env.kind:
        raise CliError(f"task {task_id} is a {kind} task, not {named[-1]}'s: leave out env={named[-1]}")
    return env


# ------------------------------------------------------------------ replay-gt
def replay_gt(args) -> int:
    interface = _interface(args.interface)
    env = env_for(args)
    by_cat: dict[str, dict[str, Any]] = {}
    tag_counts: Counter = Counter()
    failures = []
    reward_sum = 0.0
    t0 = time.perf_counter()
    ids = env.task_ids(args.split)
    for task_id in ids:
        result = play_scripted(env, task_id, env.reference_turns(task_id), interface)
        # reward_1: tasks the reference solves (its reward reaches the env's success threshold: 1 when binary)
        cat = by_cat.setdefault(category_of(task_id), {"tasks": 0, "reward_1": 0})
        cat["tasks"] += 1
        cat["reward_1"] += int(result.success)
        reward_sum += result.reward
        tag_counts.update(result.tags)
        if not result.success:
            failures.append((task_id, result.error_type or f"reward {result.reward}"))
    seconds = time.perf_counter() - t0
    summary = {
        "env": env.kind,
        "tasks": len(ids),
        "reward_1": sum(c["reward_1"] for c in by_cat.values()),
        "reward_mean": reward_sum / len(ids) if ids else 0.0,
        "by_category": by_cat,
        "tags": dict(sorted(tag_counts.items())),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"ground-truth replay, env={env.kind}, split={args.split}, format={env.tool_format}, "
            f"interface={'raw' if interface.is_raw else args.interface}"
        )
        print(f"{'category':<14}{'tasks':>7}{'solved':>10}")
        for cat_name, v in summary["by_category"].items():
            print(f"{cat_name:<14}{v['tasks']:>7}{v['reward_1']:>10}")
        print(f"{'total':<14}{summary['tasks']:>7}{summary['reward_1']:>10}   mean reward {summary['reward_mean']:.2f}")
        print("tags: " + ", ".join(f"{k}={v}" for k, v in summary["tags"].items()))
        print(f"{env.stats.tool_calls} tool calls, {env.stats.steps} steps in {seconds:.2f} s")
        for task_id, error in failures[:20]:
            print(f"FAILED {task_id}: {error}")
    return 0 if summary["reward_1"] == summary["tasks"] else 1


# ---------------------------------------------------------------------- score
def _lines(path: str) -> Iterator[str]:
    if path == "-":
        yield from sys.stdin
        return
    try:
        with open(path, encoding="utf-8") as fh:
            yield from fh
    except FileNotFoundError:
        raise CliError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise CliError(f"{path} is a directory, not a JSONL file") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text: {exc}") from None


def _read_line(line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object with task_id and turns")
    if not isinstance(obj.get("task_id"), str):
        raise ValueError("task_id must be a string")
    return obj


def _turns(obj: dict[str, Any]) -> list[list[str]]:
    turns = obj.get("turns")
    if not isinstance(turns, list) or not all(
        isinstance(t, list) and all(isinstance(s, str) for s in t) for t in turns
    ):
        raise ValueError("turns must be a list of lists of assistant step texts")
    return turns


def score(args) -> int:
    official = official_verdict if args.official else None
    envs: dict[str, Any] = {}  # one env per kind the file's task ids name
    malformed = disagreements = 0
    for number, line in enumerate(_lines(args.file), start=1):
        if not line.strip():
            continue
        row: dict[str, Any] = {
            "line": number,
            "task_id": None,
            "reward": 0,
            "tags": [],
            "labels": [],
            "progress": 0.0,
            "error_type": None,
            "error": None,
        }
        try:
            obj = _read_line(line)
            task_id = row["task_id"] = obj["task_id"]
            turns = _turns(obj)
            env = _scoring_env(args, task_id, envs)
            if env.kind == "bfcl":
                verdict, parsed = _score_bfcl(task_id, turns, env.tool_format, args.instance_mismatch)
                row.update(verdict.to_dict())
                if official is not None:
                    valid, error_type = official(parsed[0], parsed[1])
                    row["official"] = {"reward": int(valid), "error_type": error_type}
                    disagreements += (int(valid), error_type) != (verdict.reward, verdict.error_type)
            else:
                if official is not None:
                    raise ValueError(f"--official runs bfcl-eval's checker: bfcl tasks only, {task_id} is {env.kind}'s")
                row.update(_score_played(env, task_id, turns))
        except (ValueError, KeyError) as exc:
            malformed += 1
            row["error"] = str(exc.args[0]) if exc.args else str(exc)
        _print_score_row(row, args.json)
    if disagreements:
        print(f"seal: {disagreements} verdict(s) differ from bfcl-eval's checker", file=sys.stderr)
    if malformed:
        print(f"seal: {malformed} malformed line(s); the others were scored", file=sys.stderr)
    return 1 if (malformed or disagreements) else 0


def _scoring_env(args, task_id: str, envs: dict[str, Any]):
    kind = env_kind(task_id)
    if kind not in envs:
        try:
            envs[kind] = env_for(args, task_id, instance_mismatch=args.instance_mismatch)
        except CliError as exc:  # a line of another env than env= names: that line's error
            raise ValueError(str(exc)) from None
    return envs[kind]


def _score_bfcl(task_id: str, turns: list[list[str]], tool_format: str, instance_mismatch: str):
    """bfcl-eval's runner: each turn's steps decoded as given, those that decode to no call dropped,
    judged as the official checker judges them. Returns the verdict and (task, parsed turns)."""
    task = get_task(task_id)
    if len(turns) > task.num_turns:
        raise ValueError(f"{len(turns)} turns given, {task_id} has {task.num_turns}")
    signatures = call_signatures(task.involved_classes)  # binds positional python arguments
    parsed = [[parse_step(s, tool_format, signatures) for s in turn] for turn in turns]
    return judge(task, parsed, instance_mismatch), (task, parsed)


def _score_played(env, task_id: str, turns: list[list[str]]) -> dict[str, Any]:
    """Another env's verdict: the step texts played through the env (a turn ends where the env
    ends it: a step without a call), fewer turns than the task has ending the episode cut off."""
    expected = len(env.reference_turns(task_id))  # KeyError naming an unknown id
    if len(turns) > expected:
        raise ValueError(f"{len(turns)} turns given, {task_id} has {expected}")
    result = play_scripted(env, task_id, turns)
    return {k: getattr(result, k) for k in ("reward", "tags", "labels", "progress", "error_type")}


def _print_score_row(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row))
    elif row["error"]:
        print(f"line {row['line']}: ERROR {row['error']}")
    else:
        print(
            f"line {row['line']} {row['task_id']}: reward={row['reward']} progress={row['progress']:.2f} "
            f"error_type={row['error_type'] or '-'}\n  tags:   {' '.join(row['tags'])}\n  labels: {' '.join(row['labels'])}"
        )


# ----------------------------------------------------------------------- show
def show(args) -> int:
    interface = _interface(args.interface, args.guidelines)
    env = env_for(args, args.task_id)
    turns = len(env.reference_turns(args.task_id))  # one entry per user turn; KeyError for an unknown id
    messages = env.reset(args.task_id, interface)
    print(
        f"# {args.task_id} ({category_of(args.task_id)}), env={env.kind}, format={env.tool_format}, "
        f"interface v{interface.version}: {json.dumps(interface.to_dict())}"
    )
    for m in messages:
        print(f"\n=== {m['role']} (turn 0) ===\n{m['content']}")
    for turn in range(1, turns):
        for m in env.user_messages(turn):
            print(f"\n=== {m['role']} (turn {turn}) ===\n{m['content']}")
    return 0
