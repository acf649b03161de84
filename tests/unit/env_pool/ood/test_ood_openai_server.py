"""The OpenAI-compatible endpoint's HTTP/protocol layer, with scripted replies
(what is under test is the protocol and the tool-call conversion, not a model),
plus the OOD view registry and the rendering our generator sees."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from env_pool.ood import AVAILABLE_VIEWS, UNAVAILABLE_VIEWS, VIEW_TARGETS
from env_pool.ood.openai_server import ChatServer, Reply, openai_message, prose_outside_calls
from env_pool.tool_calls import parse_step
from evaluation.ood_backend import render_messages

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find",
            "description": "Find a thing.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def post(url: str, body: dict, timeout: float = 10) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def scripted():
    replies = iter(
        [
            Reply(
                'Looking.\n<tool_call>\n{"name": "find", "arguments": {"q": "a </tool_call> b"}}\n</tool_call>', 12, 9
            ),
            "It is in the drawer.",
            '<tool_call>{"name": "find", "arguments": {"q": 1}</tool_call>',  # broken JSON: a failed call
            '<tool_call>{"name": "find", "arguments": {}}</tool_call><tool_call>{"name": "find", "arguments": {"q": "x"}}</tool_call>',
        ]
    )
    seen = []

    def generate(messages, tools, temperature, max_tokens):
        seen.append({"messages": messages, "tools": tools, "temperature": temperature, "max_tokens": max_tokens})
        return next(replies)

    with ChatServer({"agent": generate, "user": lambda *a: "###STOP###"}) as server:
        yield server, seen


def test_replies_become_openai_messages_with_tool_calls(scripted):
    server, seen = scripted
    body = {
        "model": "agent",
        "messages": [{"role": "user", "content": "where?"}],
        "tools": TOOLS,
        "temperature": 0.25,
        "max_tokens": 17,
        "tool_choice": "auto",
    }
    status, out = post(server.base_url, body)
    assert status == 200 and out["object"] == "chat.completion" and out["model"] == "agent"
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["role"] == "assistant" and msg["content"] == "Looking."
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "find"
    # the string argument keeps its text, closing tag included
    assert json.loads(call["function"]["arguments"]) == {"q": "a </tool_call> b"}
    assert out["usage"] == {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
    # the callable got the request's lists unchanged
    assert seen[0] == {"messages": body["messages"], "tools": TOOLS, "temperature": 0.25, "max_tokens": 17}

    status, out = post(server.base_url, {"model": "agent", "messages": [{"role": "user", "content": "?"}]})
    msg = out["choices"][0]["message"]
    assert status == 200 and msg["content"] == "It is in the drawer." and msg["tool_calls"] is None
    assert out["choices"][0]["finish_reason"] == "stop" and seen[1]["tools"] is None

    status, out = post(server.base_url, {"model": "agent", "messages": [{"role": "user", "content": "?"}]})
    msg = out["choices"][0]["message"]  # a failed call goes back as text, counted
    assert msg["tool_calls"] is None and msg["content"].startswith("<tool_call>")
    assert server.stats.parse_errors == 1

    status, out = post(server.base_url, {"model": "agent", "messages": [{"role": "user", "content": "?"}]})
    calls = out["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{}, {"q": "x"}]
    assert len({c["id"] for c in calls}) == 2 and out["choices"][0]["message"]["content"] is None
    assert server.stats.tool_calls == 3 and server.stats.requests == 4 and server.stats.errors == 0


def test_models_are_routed_by_name_and_bad_requests_rejected(scripted):
    server, _ = scripted
    status, out = post(server.base_url, {"model": "user", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and out["choices"][0]["message"]["content"] == "###STOP###"
    with urllib.request.urlopen(server.base_url + "/models", timeout=10) as resp:
        assert sorted(m["id"] for m in json.loads(resp.read())["data"]) == ["agent", "user"]
    assert post(server.base_url, {"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}]})[0] == 404
    assert post(server.base_url, {"model": "user", "messages": []})[0] == 400
    assert (
        post(server.base_url, {"model": "user", "messages": [{"role": "user", "content": "x"}], "stream": True})[0]
        == 400
    )
    assert post(server.base_url, {"model": "user", "messages": [{"role": "user", "content": "x"}], "n": 2})[0] == 400
    assert (
        post(server.base_url, {"model": "user", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"})[
            0
        ]
        == 400
    )
    assert (
        post(server.base_url, {"model": "user", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0})[0]
        == 400
    )
    assert server.stats.errors == 6
    # null sampling fields take OpenAI's defaults
    status, _ = post(
        server.base_url,
        {"model": "user", "messages": [{"role": "user", "content": "x"}], "temperature": None, "max_tokens": None},
    )
    assert status == 200


def test_a_kept_alive_connection_stays_in_step_after_an_error(scripted):
    import http.client
    from urllib.parse import urlparse

    server, _ = scripted
    url = urlparse(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    body = json.dumps({"model": "user", "messages": [{"role": "user", "content": "x"}]})
    conn.request("POST", "/v1/nowhere", body=body, headers={"Content-Type": "application/json"})
    first = conn.getresponse()
    assert first.status == 404
    first.read()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    second = conn.getresponse()  # same connection: the 404's body did not linger in the stream
    assert second.status == 200 and json.loads(second.read())["choices"][0]["message"]["content"] == "###STOP###"
    conn.close()


def test_a_failing_generate_is_a_500_and_the_server_keeps_serving():
    calls = []

    def generate(messages, tools, temperature, max_tokens):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("engine died")
        return "fine"

    with ChatServer({"m": generate}) as server:
        status, out = post(server.base_url, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert status == 500 and "engine died" in out["error"]["message"]
        status, out = post(server.base_url, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert status == 200 and out["choices"][0]["message"]["content"] == "fine"


def test_generate_calls_are_serialised():
    active, peak, lock = [0], [0], threading.Lock()
    gate = threading.Event()

    def generate(messages, tools, temperature, max_tokens):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        gate.wait(0.2)
        with lock:
            active[0] -= 1
        return "ok"

    with ChatServer({"m": generate}) as server:
        threads = [
            threading.Thread(
                target=post, args=(server.base_url, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
            )
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert peak[0] == 1 and server.stats.requests == 4


def test_prose_outside_calls_and_message_conversion():
    text = 'a <tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call> b'
    assert prose_outside_calls(text) == "a  b"
    msg, err = openai_message("no calls here")
    assert err is None and msg["content"] == "no calls here" and msg["tool_calls"] is None


def test_rendering_round_trips_tool_calls_into_our_format():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "where?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "find", "arguments": '{"q": "keys"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"where": "drawer"}'},
    ]
    out = render_messages(messages, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool"]
    assert (
        out[0]["content"].startswith("Be brief.")
        and "<tools>" in out[0]["content"]
        and '"name": "find"' in out[0]["content"]
    )
    parsed = parse_step(out[2]["content"], "json")  # what the model would have emitted
    assert [(c.name, c.arguments) for c in parsed.calls] == [("find", {"q": "keys"})]
    assert out[3]["content"] == '{"where": "drawer"}'
    assert render_messages([{"role": "user", "content": "hi"}], None) == [{"role": "user", "content": "hi"}]


def test_view_registry_lists_available_and_unavailable_views():
    assert set(AVAILABLE_VIEWS) == {
        "tau2_retail",
        "tau2_airline",
        "tau2_telecom",
        "bfcl_memory_kv",
        "bfcl_memory_rec_sum",
    }
    assert set(UNAVAILABLE_VIEWS) == {"bfcl_web_search", "bfcl_memory_vector"}
    assert all("needs network" in reason for reason in UNAVAILABLE_VIEWS.values())
    assert all("not comparable" in AVAILABLE_VIEWS[v] for v in AVAILABLE_VIEWS if v.startswith("tau2_"))
    assert all(
        "BFCL V4 Memory (kv + rec_sum)" in AVAILABLE_VIEWS[v] for v in AVAILABLE_VIEWS if v.startswith("bfcl_memory")
    )
    assert set(VIEW_TARGETS) == set(AVAILABLE_VIEWS)
