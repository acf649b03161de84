"""A small OpenAI-compatible chat-completions endpoint on 127.0.0.1.

tau^2-bench's agent and user simulator call models through litellm; pointing
both at this server (``openai/<name>`` with ``api_base=server.base_url``) lets
our own generator play both parts offline. The server wraps a ``generate``
callable per model name:

    generate(messages, tools, temperature, max_tokens) -> str | Reply

``messages`` and ``tools`` are the request's OpenAI-format lists, unchanged.
The reply text is our model's raw output: ``<tool_call>{json}</tool_call>``
blocks in it become OpenAI ``tool_calls`` (decoded by our strict parser in
env_pool/tool_calls.py, so nothing from the model is evaluated); the text
outside the blocks is the message content. A reply that tries a call but is
not a valid one goes back as plain content, as an OpenAI-compatible server's
tool parser does, and is counted in ``stats.parse_errors``.

Only what litellm's OpenAI client sends is implemented: POST
/v1/chat/completions (non-streaming, n=1) and GET /v1/models. stdlib only:
a thread per connection, and by default one generate call at a time (a
generator engine is usually not safe to call from several threads).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from env_pool.tool_calls import ToolCall, parse_step

_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"
_MAX_BODY = 64 * 1024 * 1024  # tau2 prompts are tens of KB; refuse absurd bodies


class PromptTooLong(ValueError):
    """Raised by a generate callable whose model cannot hold the prompt. The
    client gets OpenAI's answer to that (400, code context_length_exceeded),
    which litellm raises as ContextWindowExceededError."""


@dataclass(frozen=True)
class Reply:
    """A generation with its token counts (litellm and tau2 record usage)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # "length" when the token budget ran out


GenerateFn = Callable[[list[dict], "list[dict] | None", float, "int | None"], "str | Reply"]


@dataclass
class ServerStats:
    requests: int = 0
    errors: int = 0  # requests answered with a 4xx/5xx
    parse_errors: int = 0  # replies that tried a call but were not valid calls
    tool_calls: int = 0
    completions: Counter = field(default_factory=Counter)  # answered requests per model name


def openai_message(text: str) -> tuple[dict[str, Any], str | None]:
    """(OpenAI assistant message, parse error) for one model output."""
    parsed = parse_step(text, "json")
    if parsed.error is not None or not parsed.calls:
        return {"role": "assistant", "content": text, "tool_calls": None}, parsed.error
    content = prose_outside_calls(text).strip() or None
    calls = [_openai_call(c) for c in parsed.calls]
    return {"role": "assistant", "content": content, "tool_calls": calls}, None


def _openai_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
    }


def prose_outside_calls(text: str) -> str:
    """The text of a step that parsed as calls, less its <tool_call> blocks.

    Blocks are delimited by decoding their JSON (as the parser does), so a
    string argument holding "</tool_call>" does not cut the block short."""
    decoder = json.JSONDecoder()
    out, pos = [], 0
    while True:
        start = text.find(_TAG_OPEN, pos)
        if start < 0:
            break
        out.append(text[pos:start])
        body = start + len(_TAG_OPEN)
        body += len(text[body:]) - len(text[body:].lstrip(" \t\r\n"))
        _, end = decoder.raw_decode(text, body)
        close = text.index(_TAG_CLOSE, end)
        pos = close + len(_TAG_CLOSE)
    out.append(text[pos:])
    return "".join(out)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: litellm's httpx client reuses connections

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        pass  # one line per request on stderr would drown test and eval output

    def do_GET(self) -> None:  # stdlib naming
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            data = [{"id": name, "object": "model", "owned_by": "seal"} for name in self.server.owner.models]
            return self._send(200, {"object": "list", "data": data})
        self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # stdlib naming
        owner = self.server.owner
        with owner.lock:
            owner.stats.requests += 1
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length <= 0 or length > _MAX_BODY:
            self.close_connection = True  # the body (if any) was not read: the stream is out of step
            return self._error(400, "a JSON body with a Content-Length under 64 MiB is required")
        raw = self.rfile.read(length)  # read before any answer, so a kept-alive connection stays in step
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            return self._error(404, f"no route {self.path}")
        try:
            req = json.loads(raw)
        except ValueError as exc:
            return self._error(400, f"body is not JSON: {exc}")
        problem = _request_problem(req, owner.models)
        if problem:
            return self._error(404 if problem.startswith("unknown model") else 400, problem)
        generate = owner.models[req["model"]]
        max_tokens = req.get("max_completion_tokens", req.get("max_tokens"))
        temperature = 1.0 if req.get("temperature") is None else float(req["temperature"])  # OpenAI's default
        try:
            with owner.generate_lock:
                reply = generate(req["messages"], req.get("tools") or None, temperature, max_tokens)
        except PromptTooLong as exc:
            return self._error(
                400, f"This model's maximum context length is exceeded: {exc}", code="context_length_exceeded"
            )
        except Exception as exc:  # the client sees the failure; the server keeps serving
            return self._error(500, f"generate failed: {type(exc).__name__}: {exc}", kind="server_error")
        if isinstance(reply, str):
            reply = Reply(reply)
        if not isinstance(reply, Reply) or not isinstance(reply.text, str):
            return self._error(500, f"generate returned {type(reply).__name__}, not text or Reply", kind="server_error")
        message, parse_error = openai_message(reply.text)
        with owner.lock:
            owner.stats.completions[req["model"]] += 1
            owner.stats.parse_errors += parse_error is not None
            owner.stats.tool_calls += len(message["tool_calls"] or [])
        finish = "tool_calls" if message["tool_calls"] else reply.finish_reason
        self._send(
            200,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                },
            },
        )

    def _error(
        self, status: int, message: str, kind: str = "invalid_request_error", code: str | int | None = None
    ) -> None:
        with self.server.owner.lock:
            self.server.owner.stats.errors += 1
        self._send(status, {"error": {"message": message, "type": kind, "code": status if code is None else code}})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _request_problem(req: Any, models: Mapping[str, Any]) -> str | None:
    if not isinstance(req, dict):
        return "the body must be a JSON object"
    if req.get("model") not in models:
        return f"unknown model {req.get('model')!r}; served: {sorted(models)}"
    if not isinstance(req.get("messages"), list) or not req["messages"]:
        return "messages must be a non-empty list"
    if req.get("stream"):
        return "streaming is not supported"
    if req.get("n", 1) != 1:
        return "only n=1 is supported"
    tools = req.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "tools must be a list"
    temperature = req.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))):
        return "temperature must be a number"
    for key in ("max_tokens", "max_completion_tokens"):
        value = req.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"{key} must be a positive integer"
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ChatServer


class ChatServer:
    """Serves ``models`` (name -> generate) until closed; a context manager.

    ``base_url`` is what litellm takes as ``api_base`` (it ends in /v1)."""

    def __init__(
        self, models: Mapping[str, GenerateFn], host: str = "127.0.0.1", port: int = 0, serialize: bool = True
    ) -> None:
        if not models:
            raise ValueError("serve at least one model")
        self.models = dict(models)
        self.stats = ServerStats()
        self.lock = threading.Lock()
        # Without serialisation concurrent requests call generate in parallel.
        self.generate_lock: Any = threading.Lock() if serialize else _NoLock()
        self._httpd = _Server((host, port), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ood-chat-server", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ChatServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
