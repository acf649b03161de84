"""Safe access to bfcl-eval's executable API classes.

bfcl-eval's own executor eval()s call strings and keeps instances in module
globals (docs/design.md, bfcl-eval). We reuse its API classes and its
checkers but execute calls by direct method dispatch on instances we own:
no eval, nothing left in its globals, one instance set per episode.
The result formatting, the blocked-name list and the name resolution
(later classes win) mirror ``execute_multi_turn_func_call`` exactly, so the
results match what the official checker computes.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import inspect
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

# Names bfcl-eval refuses to execute (execute_multi_turn_func_call).
_BLOCKED = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
_BACKEND = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
ERROR_PREFIX = "Error during execution: "


def prepare_import() -> None:
    """Keep bfcl-eval from writing folders into site-packages on import."""
    if "BFCL_PROJECT_ROOT" not in os.environ:
        root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "seal" / "bfcl_root"
        root.mkdir(parents=True, exist_ok=True)
        os.environ["BFCL_PROJECT_ROOT"] = str(root)


@lru_cache(maxsize=1)
def package_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "bfcl-eval is not installed; run scripts/setup.sh (it installs bfcl-eval==2026.3.23 with --no-deps)"
        )
    return Path(list(spec.submodule_search_locations)[0])


@lru_cache(maxsize=1)
def _class_modules() -> dict[str, str]:
    prepare_import()
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return dict(CLASS_FILE_PATH_MAPPING)


@lru_cache(maxsize=1)
def _stateless() -> frozenset[str]:
    prepare_import()
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    return frozenset(STATELESS_CLASSES)


@cache
def api_class(class_name: str) -> type:
    modules = _class_modules()
    if class_name not in modules:
        raise KeyError(f"unknown BFCL API class {class_name!r}")
    prepare_import()
    return getattr(importlib.import_module(modules[class_name]), class_name)


@cache
def public_methods(class_name: str) -> tuple[str, ...]:
    cls = api_class(class_name)
    return tuple(n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_"))


@dataclass(frozen=True)
class ExecCall:
    """A call ready to dispatch: literal positional and keyword arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class InstanceSet:
    """One episode's private instances of the involved API classes."""

    def __init__(self, initial_config: dict, involved_classes: list[str], long_context: bool):
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, Any] = {}
        for class_name in involved_classes:
            inst = api_class(class_name)()
            if class_name not in _stateless():
                inst._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=long_context)
                if long_context:
                    isolate_shared_state(inst)
            self.instances[class_name] = inst
            # Later classes win on name clashes, as in bfcl-eval's mapping.
            for name in public_methods(class_name):
                self._methods[name] = getattr(inst, name)

    def has(self, name: str) -> bool:
        return name in self._methods

    def class_of(self, name: str) -> str | None:
        method = self._methods.get(name)
        return type(method.__self__).__name__ if method is not None else None

    def execute(self, call: ExecCall) -> str:
        if call.name in _BLOCKED:
            return f"{ERROR_PREFIX}Function call {call.name} is not allowed."
        method = self._methods.get(call.name)
        if method is None:
            return f"{ERROR_PREFIX}name '{call.name}' is not defined"
        # Fresh argument objects per execution, as eval of a call string gives:
        # APIs store lists by reference, and a shared list would carry one
        # instance set's mutations into another.
        args, kwargs = copy.deepcopy((call.args, call.kwargs))
        try:
            result = method(*args, **kwargs)
        except Exception as exc:  # the API's own errors are results, as in bfcl-eval
            return f"{ERROR_PREFIX}{exc}"
        if type(result) is str:
            return result
        if type(result) is dict:
            try:
                return json.dumps(result)
            except Exception:
                return str(result)
        return str(result)


def isolate_shared_state(inst: Any) -> None:
    # long_context TravelAPI / VehicleControlAPI merge module-level dicts into
    # their state by reference; a mutation would leak into every later
    # instance in the process. Give each instance its own copies.
    for key, value in list(vars(inst).items()):
        if not key.startswith("_") and isinstance(value, (dict, list)):
            setattr(inst, key, copy.deepcopy(value))


def is_error_result(result: str) -> bool:
    """An execution error: an exception, or an API's {"error": ...} reply."""
    if result.startswith(ERROR_PREFIX):
        return True
    if result.startswith("{") and '"error"' in result:
        try:
            obj = json.loads(result)
        except ValueError:
            return False
        return isinstance(obj, dict) and "error" in obj
    return False


def error_text(result: str) -> str:
    if result.startswith(ERROR_PREFIX):
        return result[len(ERROR_PREFIX) :]
    try:
        obj = json.loads(result)
        return str(obj.get("error", result))
    except (ValueError, AttributeError):
        return result


@lru_cache(maxsize=8192)
def parse_ground_truth_call(source: str) -> ExecCall:
    """Ground-truth calls are trusted dataset text; still parsed as literals."""
    node = ast.parse(source, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"ground-truth call is not a plain call: {source!r}")
    args = tuple(ast.literal_eval(a) for a in node.args)
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    return ExecCall(node.func.id, args, kwargs)


@cache
def method_parameters(class_name: str, name: str) -> tuple[str, ...]:
    """The API method's parameter names in positional order (without self)."""
    return tuple(p for p in inspect.signature(getattr(api_class(class_name), name)).parameters if p != "self")


def keyword_form(call: ExecCall, class_name: str) -> dict[str, Any]:
    """Name every argument (positional ones by the method's signature)."""
    if not call.args:
        return dict(call.kwargs)
    named = dict(zip(method_parameters(class_name, call.name), call.args))
    named.update(call.kwargs)
    return named


@lru_cache(maxsize=256)
def call_signatures(involved_classes: tuple[str, ...]) -> Mapping[str, tuple[str, ...]]:
    """Positional order of every callable name, for binding positional call
    arguments as bfcl-eval's executor does: it eval()s the call on the API
    method, so Python binds them by the method's signature, not by the tool
    schema's property order (they differ, e.g. TravelAPI.purchase_insurance).
    Covers every public method (withheld ones too: the executor runs them);
    later classes win, as in the name resolution."""
    return MappingProxyType(
        {
            name: method_parameters(owner, name)
            for name in {n for c in involved_classes for n in public_methods(c)}
            if (owner := method_class(involved_classes, name)) is not None
        }
    )


def method_class(involved_classes: list[str] | tuple[str, ...], name: str) -> str | None:
    """The class whose method a bare call name resolves to (later classes win)."""
    owner = None
    for class_name in involved_classes:
        if name in public_methods(class_name):
            owner = class_name
    return owner
