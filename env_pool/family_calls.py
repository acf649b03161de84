"""Tool-call formats that model families were trained with, beside SEAL's json and python.

- "llama_json": Llama 3.1/3.2's own calls: a bare JSON object ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``), several separated by ``;`` or newlines. Models of the family
  also write ``<tool_call>`` blocks, with "parameters" or "arguments": those are read too.
- "deepseek": DeepSeek V3's special tokens:
  ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>
  ... <｜tool▁calls▁end｜>``.

- "harmony": gpt-oss's calls, each a commentary-channel message to a function:
  ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``.

As in env_pool/tool_calls.py, model output is parsed into literal values only; a step that does
not start like a call in the format is prose (it ends the turn), not a failed call.
"""

from __future__ import annotations

import json
import re
from typing import Any

from env_pool.strict_json import DECODER

PYTHON_TAG = "<|python_tag|>"
DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"
_DS_FENCE = "```json"


class FamilyCallError(ValueError):
    """A step that tried a call in the family's format and got it wrong (the message says how)."""


def _call_object(obj: Any, where: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(obj, dict):
        raise FamilyCallError(f"{where} must be a JSON object with name and parameters")
    keys = set(obj)
    args_key = "parameters" if "parameters" in keys else "arguments"
    unknown = keys - {"name", args_key}
    if unknown:
        raise FamilyCallError(f"{where} has unexpected keys {sorted(unknown)}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise FamilyCallError(f"{where} needs a non-empty string 'name'")
    args = obj.get(args_key, {})
    if not isinstance(args, dict):
        raise FamilyCallError(f"{where}: '{args_key}' must be a JSON object")
    return name, args


# ---------------------------------------------------------------- llama_json
def looks_like_llama_call(text: str) -> bool:
    body = text.strip()
    return body.startswith(PYTHON_TAG) or body.startswith("{") or "<tool_call>" in body


def parse_llama_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of each call; [] for prose."""
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :].lstrip()
    if not body.startswith("{"):  # <tool_call> blocks may follow prose, as in the json format
        return _parse_tagged(body) if "<tool_call>" in body else []
    calls, pos = [], 0
    decoder = DECODER
    while pos < len(body):
        where = f"call {len(calls) + 1}"
        try:
            obj, end = decoder.raw_decode(body, pos)
        except (ValueError, RecursionError) as exc:
            raise FamilyCallError(f"{where} is not valid JSON: {exc}") from None
        calls.append(_call_object(obj, where))
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
        if pos < len(body) and body[pos] != "{":
            raise FamilyCallError(f"text after call {len(calls)}: {body[pos : pos + 40]!r}; write only the call")
    return calls


def _parse_tagged(body: str) -> list[tuple[str, dict[str, Any]]]:
    calls, pos = [], 0
    decoder = DECODER
    while (start := body.find("<tool_call>", pos)) >= 0:
        where = f"tool call {len(calls) + 1}"
        try:
            obj, end = decoder.raw_decode(body, _skip_ws(body, start + len("<tool_call>")))
        except (ValueError, RecursionError) as exc:
            raise FamilyCallError(f"{where} is not valid JSON: {exc}") from None
        close = _skip_ws(body, end)
        if not body.startswith("</tool_call>", close):
            raise FamilyCallError(f"{where}: expected </tool_call> after the JSON object")
        calls.append(_call_object(obj, where))
        pos = close + len("</tool_call>")
    return calls


def render_llama_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "\n".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)


# ------------------------------------------------------------------ deepseek
def looks_like_deepseek_call(text: str) -> bool:
    return DS_CALLS_BEGIN in text or DS_CALL_BEGIN in text


def parse_deepseek_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    begin = text.find(DS_CALLS_BEGIN)
    if begin < 0:
        if DS_CALL_BEGIN in text:
            raise FamilyCallError(f"a call begins without {DS_CALLS_BEGIN}")
        return []
    calls: list[tuple[str, dict[str, Any]]] = []
    pos = begin + len(DS_CALLS_BEGIN)
    decoder = DECODER
    while True:
        pos = _skip_ws(text, pos)
        if text.startswith(DS_CALLS_END, pos) or pos >= len(text):
            break
        where = f"call {len(calls) + 1}"
        if not text.startswith(DS_CALL_BEGIN, pos):
            raise FamilyCallError(f"{where}: expected {DS_CALL_BEGIN}, got {text[pos : pos + 30]!r}")
        sep = text.find(DS_SEP, pos)
        newline = text.find("\n", sep)
        if sep < 0 or newline < 0:
            raise FamilyCallError(f"{where}: expected function{DS_SEP}NAME on one line")
        name = text[sep + len(DS_SEP) : newline].strip()
        body = _skip_ws(text, newline)
        if not text.startswith(_DS_FENCE, body):
            raise FamilyCallError(f"{where} ({name}): expected the arguments in a ```json block")
        try:
            args, end = decoder.raw_decode(text, _skip_ws(text, body + len(_DS_FENCE)))
        except (ValueError, RecursionError) as exc:
            raise FamilyCallError(f"{where} ({name}): arguments are not valid JSON: {exc}") from None
        end = _skip_ws(text, end)
        if not text.startswith("```", end):
            raise FamilyCallError(f"{where} ({name}): expected ``` after the arguments")
        end = _skip_ws(text, end + 3)
        if not text.startswith(DS_CALL_END, end):
            raise FamilyCallError(f"{where} ({name}): expected {DS_CALL_END}")
        calls.append(_call_object({"name": name, "arguments": args}, where))
        pos = end + len(DS_CALL_END)
    return calls


def render_deepseek_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    body = "\n".join(
        f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{json.dumps(a, ensure_ascii=False)}\n```{DS_CALL_END}"
        for n, a in calls
    )
    return f"{DS_CALLS_BEGIN}{body}{DS_CALLS_END}"


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


# ------------------------------------------------------------------- harmony
HARMONY_CALL_END = "<|call|>"
_HARMONY_TO = re.compile(r"to=functions\.([A-Za-z_][\w.\-]*)")


def looks_like_harmony_call(text: str) -> bool:
    return "to=functions." in text


def parse_harmony_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    pos = 0
    while (found := _HARMONY_TO.search(text, pos)) is not None:
        name, where = found.group(1), f"call {len(calls) + 1} ({found.group(1)})"
        body = text.find("<|message|>", found.end())
        if body < 0:
            raise FamilyCallError(f"{where}: expected <|message|> before the arguments")
        try:
            args, end = DECODER.raw_decode(text, _skip_ws(text, body + len("<|message|>")))
        except (ValueError, RecursionError) as exc:
            raise FamilyCallError(f"{where}: arguments are not valid JSON: {exc}") from None
        calls.append(_call_object({"name": name, "arguments": args}, where))
        end = _skip_ws(text, end)
        pos = end + len(HARMONY_CALL_END) if text.startswith(HARMONY_CALL_END, end) else end
    return calls


def render_harmony_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """One commentary message per call, as gpt-oss writes them one after another."""
    return "<|start|>assistant".join(
        f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{json.dumps(a, ensure_ascii=False)}"
        f"{HARMONY_CALL_END}"
        for n, a in calls
    )
