"""`seal model check PATH` and `seal train`'s preflight for a model of the user's: will this model
go through the whole loop? One verdict line per check, each failure with its fix.

The checks, in order (a failed one stops those that need it):
- config: config.json is there and names its architecture and maximum positions;
- context: model.max_model_len fits the model's positions (vLLM refuses it after Ray is up otherwise);
- tokenizer: it loads offline, and decode(encode(text)) == text on text with spaces and accents;
- family: which family the chat template is (model.family names one when it cannot be told);
- end tokens: the whole end set, each one token;
- chat: a scripted three-turn chat (a tool reply, a user reply, the end) through the conversation builder;
- tool call: a call in the family's format survives encode -> generate -> decode -> parse;
- weights: the tensors the learner publishes (the HF model's, in the checkpoint's layout) are the
  checkpoint's, the names vLLM loads (and, with ``engine=True``, the installed vLLM has the architecture).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_pool.tool_calls import ToolCall, parse_step, render_calls
from families.registry import FAMILIES
from rollout.chat import ChatBuildError, ChatTokenizer

# Spaces (leading, double, tab), an apostrophe, accents, a newline: what a broken pre-tokenizer
# (Metaspace configured wrong, a byte-level tokenizer loaded as SentencePiece) drops or changes.
ROUND_TRIP_TEXT = "Move 'final report.pdf' to the  temp folder:\n\tls -a  # café, 3.5% done "
CHAT_SYSTEM = "You are a careful assistant. Tools:\nls(a: bool): list the current directory."


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        verdict = "ok  " if self.ok else "FAIL"
        return f"{verdict} {self.name:<11} {self.detail}" + ("" if self.ok else f"; fix: {self.fix}")


class _Failed(Exception):
    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.detail, self.fix = detail, fix


def max_positions(config_json: Mapping[str, Any]) -> int | None:
    text = config_json.get("text_config")
    for node in (config_json, text if isinstance(text, dict) else {}):
        if isinstance(node.get("max_position_embeddings"), int):
            return int(node["max_position_embeddings"])
    return None


def check_model_dir(
    path: str | Path,
    max_model_len: int | None = None,
    family: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    engine: bool = False,
) -> list[Check]:
    """Every check's verdict on the model directory ``path``, in order; stops at the first failure
    that the later checks need."""
    path = Path(path).expanduser()
    state: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], str], bool]] = [
        ("config", lambda: _config(path, state), True),
        ("context", lambda: _context(state, max_model_len), False),
        ("tokenizer", lambda: _tokenizer(path, state), True),
        ("family", lambda: _family(state, family, template_kwargs), True),
        ("end tokens", lambda: _end_tokens(state), True),
        ("chat", lambda: _chat(state), False),
        ("tool call", lambda: _tool_call(state), False),
        ("weights", lambda: _weights(path, state, engine), False),
    ]
    out = []
    for name, run, needed in steps:
        try:
            out.append(Check(name, True, run()))
        except _Failed as exc:
            out.append(Check(name, False, exc.detail, exc.fix))
            if needed:
                break
        except Exception as exc:  # a check that crashed is a failed check, named
            out.append(Check(name, False, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", "see above"))
            if needed:
                break
    return out


def _config(path: Path, state: dict[str, Any]) -> str:
    if not path.is_dir():
        raise _Failed(f"{path}: no such directory", "give a local HF model directory")
    try:
        config_json = json.loads((path / "config.json").read_text())
    except OSError:
        raise _Failed(
            f"{path} has no config.json", "a HF model directory holds config.json beside the weights"
        ) from None
    except ValueError as exc:
        raise _Failed(f"config.json is not JSON: {exc}", "repair config.json") from None
    state["config"] = config_json
    arch = ",".join(config_json.get("architectures") or []) or "none"
    return f"{config_json.get('model_type', '?')} ({arch}), {max_positions(config_json) or '?'} positions"


def _context(state: dict[str, Any], max_model_len: int | None) -> str:
    positions = max_positions(state["config"])
    if max_model_len is None:
        return "model.max_model_len not given: not compared"
    if positions is not None and max_model_len > positions:
        raise _Failed(
            f"model.max_model_len={max_model_len} is more than the model's {positions} positions",
            f"set model.max_model_len={positions} (or less)",
        )
    return f"model.max_model_len={max_model_len} fits {positions or 'unknown'} positions"


def _tokenizer(path: Path, state: dict[str, Any]) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    state["tokenizer"] = tok
    back = tok.decode(tok.encode(ROUND_TRIP_TEXT, add_special_tokens=False), skip_special_tokens=False)
    if back != ROUND_TRIP_TEXT:
        raise _Failed(
            f"decode(encode(text)) changes the text: {ROUND_TRIP_TEXT!r} -> {back!r}",
            "the tokenizer's pre-tokenizer or decoder is wrong for it (a DeepSeek tokenizer needs config.json "
            "with model_type deepseek_v3 beside it; a byte-level BPE must not load as SentencePiece)",
        )
    return f"{type(tok).__name__}, {len(tok)} tokens, decode(encode(text)) == text"


def _family(state: dict[str, Any], family: str | None, template_kwargs: Mapping[str, Any] | None) -> str:
    tok = state["tokenizer"]
    try:
        chat = ChatTokenizer(tok, family=family, template_kwargs=dict(template_kwargs or {}))
    except ChatBuildError as exc:
        fix = (
            "add the model's chat template (tokenizer_config.json's chat_template or chat_template.jinja)"
            if "no chat template" in str(exc)
            else f"set model.family to one of {', '.join(FAMILIES)}"
        )
        raise _Failed(str(exc), fix) from None
    if chat.harmony is None and not getattr(tok, "chat_template", None):
        raise _Failed("the tokenizer has no chat template", "add the model's chat template to tokenizer_config.json")
    state["chat"] = chat
    fam = chat.fam
    reasoning = f", reasoning {fam.reasoning[0]}" if fam.reasoning else ""
    reasoning = ", rendered by openai-harmony (reasoning: the analysis channel)" if chat.harmony else reasoning
    return f"{fam.name}: tool format {fam.tool_format}{reasoning}" + (" (model.family)" if family else "")


def _end_tokens(state: dict[str, Any]) -> str:
    chat = state["chat"]
    for tid, text in zip(chat.end_ids, chat.end_texts):
        if chat.encode(text) != [tid]:
            raise _Failed(f"end token {text!r} ({tid}) is not one token", "the tokenizer must mark it special")
    return ", ".join(f"{t} ({i})" for i, t in zip(chat.end_ids, chat.end_texts))


def _chat(state: dict[str, Any]) -> str:
    """Three generated turns (a call, an answer after the tool reply, one after a user reply), each
    continued through the conversation builder as a rollout is."""
    chat = state["chat"]
    fmt = chat.fam.tool_format
    ids = chat.prompt_ids([{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": "List the files."}])
    replies = [
        [{"role": "tool", "name": "ls", "content": '{"current_directory_content": ["notes.txt"]}'}],
        [{"role": "user", "content": "Thanks. That is all."}],
        [],
    ]
    turns = [render_calls([ToolCall("ls", {"a": True})], fmt), "There is one file: notes.txt.", "Glad to help."]
    for k, (turn, reply) in enumerate(zip(turns, replies)):
        ends_itself = any(turn.endswith(e) for e in chat.end_texts)  # a harmony call ends with <|call|>
        generated = chat.encode(turn) + ([] if ends_itself else [chat.eos_id])
        done = chat.completion(generated)
        if done.text != turn:
            raise _Failed(f"turn {k + 1} reads back as {done.text!r}, not {turn!r}", "report it: a tokenizer quirk")
        if k == 0 and not parse_step(done.text, fmt).has_calls:
            raise _Failed(f"the call in turn 1 is not read as a call in format {fmt}", "set env.tool_format")
        ids += generated + chat.continuation_ids(done.ended, reply)
    text = chat.tokenizer.decode(ids, skip_special_tokens=False)
    missing = [t for t in ("notes.txt", "That is all.", *turns) if t not in text]
    if missing:
        raise _Failed(f"the built conversation lacks {missing}", "report it: the template dropped a message")
    return f"3 turns (tool reply, user reply, end): {len(ids)} tokens"


def _tool_call(state: dict[str, Any]) -> str:
    chat = state["chat"]
    fmt = chat.fam.tool_format
    calls = [ToolCall("mv", {"source": "final report.pdf", "destination": "temp"}), ToolCall("ls", {"a": True})]
    text = render_calls(calls, fmt)
    parsed = parse_step(chat.completion(chat.encode(text) + [chat.eos_id]).text, fmt)
    if parsed.error or list(parsed.calls) != calls:
        raise _Failed(f"{fmt}: {text!r} parses as {parsed}", "set env.tool_format to a format this tokenizer keeps")
    return f"{fmt}: 2 calls round-trip through the tokenizer"


def _weights(path: Path, state: dict[str, Any], engine: bool) -> str:
    names = checkpoint_names(path)
    if not names:
        return "no safetensors weights here: not compared"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from learner.weight_broadcast import checkpoint_specs

    config = AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    published = {name for name, _, _ in checkpoint_specs(model)}  # what every weight path of the learner sends
    buffers = {name for name, _ in model.named_buffers()}  # in a checkpoint, never trained: not sent
    missing, extra = sorted(published - names), sorted(names - published - buffers)
    if missing or extra:
        raise _Failed(
            f"the learner publishes names this checkpoint (what vLLM loads) does not hold: {missing[:2]}; "
            f"the checkpoint holds {extra[:2]} that the learner never sends",
            "save the model with save_pretrained of the pinned transformers (5.19)",
        )
    detail = f"{len(published)} tensors the learner publishes ({type(model).__name__}) are the checkpoint's"
    if engine:
        from vllm.model_executor.models import ModelRegistry

        archs = [a for a in (state["config"].get("architectures") or []) if a in ModelRegistry.get_supported_archs()]
        if not archs:
            raise _Failed(f"vLLM has no {state['config'].get('architectures')}", "pick a model vLLM supports")
        detail += f"; vLLM serves {archs[0]}"
    return detail


def checkpoint_names(path: Path) -> set[str]:
    """Tensor names of the safetensors checkpoint in ``path`` (headers only, nothing loaded)."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


def verdict(checks: list[Check]) -> str:
    failed = [c for c in checks if not c.ok]
    if not failed:
        return f"model check passed ({len(checks)} checks)"
    return f"model check failed: {failed[0].name}: {failed[0].detail}; fix: {failed[0].fix}"
