"""What the policy sees: system prompt, withheld-function reveals, tool results.

Two tool-call formats. "python" is BFCL's own default prompt (classic style,
plaintext, python call list), built from bfcl-eval's prompt constants.
"json" is the Qwen/Hermes tool format the paper trains with, under the same
persona, task and multi-turn instructions. Tool docs are compact JSON by
default (``tool_doc_indent=None``): BFCL's indent=4 costs 10 to 13K tokens a
prompt, more than a small model's context.
With the raw interface the output is exactly the benchmark prompt; the
training interface only adds to it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from env_pool.bfcl.runtime import prepare_import
from env_pool.interface.prompt import with_interface
from env_pool.interface.schema_lite import annotate_tools
from env_pool.interface.state import InterfaceState
from env_pool.schema import function_tools

HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)

# Llama 3.1/3.2's own tools prompt (its chat template's words), for its own call format.
LLAMA_TOOLS = (
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {{"name": function name, "parameters": dictionary of argument name and its value}}.'
    "Do not use variables.\n\n{tools}"
)
# DeepSeek V3's call tokens, shown in the words of its later releases' tools prompt.
DEEPSEEK_TOOLS = (
    "## Tools\n\nYou have access to the following tools:\n{tools}\n\n"
    "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_name\n```json\n"
    "{{arguments as a JSON object}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n"
    "Several calls go one after another inside <｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>."
)
# gpt-oss (harmony): calls are commentary-channel messages to functions.NAME.
HARMONY_TOOLS = (
    "# Tools\n\nCall a tool with a message on the commentary channel to functions.<tool name>, "
    "its arguments as a JSON object:\n{tools}"
)
FAMILY_TOOLS = {"json": HERMES_TOOLS, "llama_json": LLAMA_TOOLS, "deepseek": DEEPSEEK_TOOLS, "harmony": HARMONY_TOOLS}


@lru_cache(maxsize=1)
def _bfcl_prompt_parts() -> dict[str, str]:
    prepare_import()
    from bfcl_eval.constants import default_prompts as P

    style = P.PROMPT_STYLE_TEMPLATES["classic"]
    return {
        "persona": style["persona"],
        "task": style["task"],
        "tool_call_format": style["tool_call_no_tag"].format(
            output_format=P.OUTPUT_FORMAT_MAPPING["python"], param_types=P.PARAM_TYPE_MAPPING["python"]
        ),
        "multiturn_behavior": style["multiturn_behavior"],
        "available_tools": style["available_tools"],
        "template": P.PROMPT_TEMPLATE_MAPPING["plaintext"],
        "more_functions": P.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
        "more_functions_fc": P.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
    }


def tool_docs_text(tools: Sequence[dict[str, Any]], fmt: str, indent: int | None) -> str:
    if fmt in FAMILY_TOOLS:
        return "\n".join(
            json.dumps({"type": "function", "function": t}, indent=indent, ensure_ascii=False) for t in tools
        )
    return json.dumps(list(tools), indent=indent, ensure_ascii=False)


# bfcl-eval appends this to every tool description it shows at the start
# (add_language_specific_hint_to_function_doc); withheld tools revealed later
# are shown without it.
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."


def benchmark_docs(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**doc, "description": doc.get("description", "") + PYTHON_HINT} for doc in tools]


def system_prompt(
    tools: Sequence[dict[str, Any]],
    fmt: str,
    interface: InterfaceState,
    category: str | None = None,
    indent: int | None = None,
    tools_text: bool = True,
) -> str:
    """``tools_text=False``: the tools go to the chat template's own tools block (``template_tools``),
    so the prompt leaves them out (the json, llama_json, deepseek and harmony formats only)."""
    p = _bfcl_prompt_parts()
    docs = tool_docs_text(annotate_tools(benchmark_docs(tools), interface), fmt, indent)
    if not tools_text and fmt not in FAMILY_TOOLS:
        raise ValueError(f"tool format {fmt!r} shows its tools in the prompt; a template's tools block cannot")
    if fmt == "python":
        prompt = p["template"].format(
            persona=p["persona"],
            task=p["task"],
            tool_call_format=p["tool_call_format"],
            multiturn_behavior=p["multiturn_behavior"],
            available_tools=p["available_tools"].format(format="json", functions=docs),
        )
    elif fmt in FAMILY_TOOLS:
        tools_part = FAMILY_TOOLS[fmt].format(tools=docs) + "\n" if tools_text else ""
        prompt = f"{p['persona']} {p['task']}\n\n{p['multiturn_behavior']}\n\n" + tools_part
    else:
        raise ValueError(f"unknown tool-call format {fmt!r}")
    return with_interface(prompt, interface, category)


def template_tools(tools: Sequence[dict[str, Any]], interface: InterfaceState) -> list[dict[str, Any]]:
    """The tools as a chat template's tools block takes them: the prompt's docs (the benchmark's hint,
    the interface's annotations) in JSON Schema."""
    return function_tools(annotate_tools(benchmark_docs(tools), interface))


def reveal_message(
    tools: Sequence[dict[str, Any]], fmt: str, interface: InterfaceState, indent: int | None = None
) -> str:
    """The user message of a miss_func turn that adds the withheld tools."""
    p = _bfcl_prompt_parts()
    shown = annotate_tools(tools, interface)
    if fmt == "python":
        # bfcl-eval formats the python list of schema dicts into its prompt.
        return p["more_functions"].format(functions=shown)
    return f"<tools>\n{tool_docs_text(shown, fmt, indent)}\n</tools>\n{p['more_functions_fc']}"
