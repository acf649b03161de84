"""Tools from Python functions (env_pool/tool_functions.py): one ToolSet gives the schemas (BFCL's
dialect, from type hints and docstrings), the names, the parser's signatures and the executor, whose
every refusal is an error result the model reads."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from env_pool.tool_calls import ToolCall, parse_step
from env_pool.tool_functions import ToolError, ToolSet, is_error_result, tool_schema

Unit = Literal["km", "mi"]


def convert(value: float, unit: Unit, digits: int = 2, tags: list[str] | None = None) -> str:
    """Convert a distance
    to the other unit.

    Args:
        value: The distance.
        unit (str): The unit it is in:
            km or mi.
        digits: Decimals to keep.

    Returns:
        value: not a parameter's line, once the block above ended.
    """
    if value < 0:
        raise ToolError("a distance is never negative")
    factor = 0.621371 if unit == "km" else 1 / 0.621371
    return f"{value * factor:.{digits}f}"


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def bump(self, by: int) -> dict[str, int]:
        """Add to the count.

        by: How much.
        """
        if by == 0:
            raise ValueError("bumping by 0 changes nothing")
        self.count += by
        return {"count": self.count}


def test_a_function_becomes_a_schema_from_its_hints_and_docstring():
    assert tool_schema(convert) == {
        "name": "convert",
        "description": "Convert a distance to the other unit.",
        "parameters": {
            "type": "dict",
            "properties": {
                "value": {"type": "float", "description": "The distance."},
                "unit": {"type": "string", "enum": ["km", "mi"], "description": "The unit it is in: km or mi."},
                "digits": {"type": "integer", "description": "Decimals to keep."},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["value", "unit"],
        },
    }
    assert tool_schema(Counter.bump)["parameters"]["properties"] == {
        "by": {"type": "integer", "description": "How much."}
    }


def test_one_toolset_holds_names_schemas_signatures_and_runs_calls():
    tools = ToolSet(convert, Counter.bump)
    assert tools.names == ("convert", "bump") and tools.by_name["bump"] is tools.schemas[1]
    assert tools.signatures == {"convert": ("value", "unit", "digits", "tags"), "bump": ("by",)}
    (call,) = parse_step("[convert(3.0, 'km')]", "python", tools.signatures).calls  # positional: bound in order
    assert call == ToolCall("convert", {"value": 3.0, "unit": "km"}) and tools.execute(call) == "1.86"
    counter = Counter()
    assert json.loads(tools.execute(ToolCall("bump", {"by": 2}), counter)) == {"count": 2} and counter.count == 2


@pytest.mark.parametrize(
    "call, error",
    [
        (ToolCall("teleport", {}), "unknown tool 'teleport'"),
        (ToolCall("convert", {"unit": "km"}), "missing required argument 'value'"),
        (ToolCall("convert", {"value": 1.0, "unit": "ly"}), "argument 'unit' must be one of ['km', 'mi']"),
        (ToolCall("convert", {"value": "far", "unit": "km"}), "argument 'value' expected float, got str"),
        (ToolCall("convert", {"value": -1.0, "unit": "km"}), "a distance is never negative"),
        (ToolCall("bump", {"by": 0}), "bumping by 0 changes nothing"),
    ],
)
def test_every_refusal_is_an_error_result_never_an_exception(call, error):
    result = ToolSet(convert, Counter.bump).execute(call, Counter())
    assert is_error_result(result) and json.loads(result) == {"error": error}


def test_a_tool_the_schema_cannot_describe_is_refused_when_the_set_is_built():
    def bare(x: int) -> int:
        return x

    def untyped(x) -> int:  # type: ignore[no-untyped-def]
        """Echo."""
        return x

    def odd(x: complex) -> int:
        """Echo."""
        return 0

    with pytest.raises(TypeError, match="tool bare has no docstring"):
        ToolSet(bare)
    with pytest.raises(TypeError, match="tool untyped: parameter x needs a type hint"):
        ToolSet(untyped)
    with pytest.raises(TypeError, match="tool odd, parameter x: no schema type for <class 'complex'>"):
        ToolSet(odd)
    with pytest.raises(TypeError, match="tool bump is a method: execute it with the episode's state"):
        ToolSet(Counter.bump).execute(ToolCall("bump", {"by": 1}))
