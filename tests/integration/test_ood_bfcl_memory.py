"""BFCL V4 Memory (kv + rec_sum) harness on real bfcl-eval data, backends and
checker, no model: scripted reference agents write the prerequisite
conversations into memory through the backend tools (snapshots go through
bfcl-eval's own files), read memory back for a question, and answer.
Gold answers score 1, wrong or missing answers 0."""

from __future__ import annotations

import pytest

from env_pool.ood import bfcl_memory as M
from env_pool.tool_calls import ToolCall, render_calls

# The first question of each scenario (notetaker's second: its first asks
# about a later conversation); their sources lie early in the prerequisite
# chain, so a verbatim note-taker still has them within the backend limits.
QUESTIONS = ("0-customer-0", "30-healthcare-0", "55-finance-0", "80-student-0", "131-notetaker-1")


def qid(backend: str, suffix: str) -> str:
    return f"memory_{backend}_{suffix}"


@pytest.fixture(scope="module", params=M.BACKENDS)
def noted_run(request, tmp_path_factory):
    """Every scenario's prerequisite chain played by the note-taker."""
    backend = request.param
    run = M.MemoryRun(backend, tmp_path_factory.mktemp(f"memory_{backend}"))
    scenarios = sorted({q.scenario for q in run.data.questions})
    episodes = {s: M.play_prereqs(run, s, M.note_taker(backend)) for s in scenarios}
    return run, episodes


def test_data_matches_bfcl_v4_memory():
    for backend in M.BACKENDS:
        data = M.load(backend)
        assert len(data.questions) == 155 and len(data.prereqs) == 37
        assert data.class_name == f"MemoryAPI_{backend}"
        assert all(q.answers for q in data.questions)
        assert all(q.turns[0][0]["role"] == "system" for q in data.questions)  # the answer-format prompt
    assert M.LABEL == "BFCL V4 Memory (kv + rec_sum)"
    with pytest.raises(ValueError, match="not available offline"):
        M.load("vector")


def test_prerequisites_write_memory_snapshots(noted_run):
    run, episodes = noted_run
    for scenario, eps in episodes.items():
        assert all(e.tool_calls > 0 and not e.forced_quit for e in eps)
        # real backend results: the first notes are stored, later ones may hit the backend's limits
        assert eps[0].tool_errors == 0
        files = list(run.root.rglob(f"{scenario}_final.json"))
        assert len(files) == 1 and files[0].stat().st_size > 100


@pytest.mark.parametrize("suffix", QUESTIONS)
def test_gold_answer_read_from_memory_scores_one(noted_run, suffix):
    run, _ = noted_run
    question = run.data.question(qid(run.data.backend, suffix))
    episode = M.run_entry(run, question, M.memory_reader(run.data.backend, question.answers[0]))
    score = M.score_episode(run, episode)
    assert score.valid and score.error_type is None, score
    # the answer really came back through the backend from the snapshot chain
    from bfcl_eval.eval_checker.agentic_eval.agentic_checker import standardize_string

    memory = standardize_string(M.retrieved_text(episode))
    assert any(standardize_string(a) in memory for a in question.answers)
    assert episode.tool_errors == 0 and episode.tool_calls >= 1


@pytest.mark.parametrize("suffix", QUESTIONS)
def test_wrong_or_dropped_answer_scores_zero(noted_run, suffix):
    run, _ = noted_run
    backend = run.data.backend
    question = run.data.question(qid(backend, suffix))
    wrong = M.score_episode(run, M.run_entry(run, question, M.memory_reader(backend, "I do not know")))
    assert not wrong.valid and wrong.error_type == "agentic:answer_not_found"
    dropped_episode = M.run_entry(run, question, M.memory_reader(backend, None))
    dropped = M.score_episode(run, dropped_episode)
    assert dropped_episode.forced_quit  # it never stopped calling: bfcl's step limit ended it
    assert not dropped.valid and dropped.error_type == "agentic:no_last_message"
    # an answer hidden in a call's arguments is not a final message
    in_call = render_calls(
        [
            ToolCall(
                "memory_retrieve" if backend == "rec_sum" else "core_memory_list_keys", {"note": question.answers[0]}
            )
        ],
        "json",
    )
    assert not M.score_steps(question, [in_call], backend).valid
    # the checker reads the last non-call step: a gold answer followed by a wrong one fails
    gold = "{'answer': %r}" % question.answers[0]
    assert M.score_steps(question, [gold], backend).valid
    assert not M.score_steps(question, [gold, "{'answer': 'I do not know'}"], backend).valid


def test_without_notes_memory_holds_no_answer(tmp_path):
    """Control: prerequisites played by an agent that never writes leave the
    memory empty, so reading it back finds no answer."""
    for backend in M.BACKENDS:
        run = M.MemoryRun(backend, tmp_path / backend)
        question = run.data.question(qid(backend, QUESTIONS[0]))
        M.play_prereqs(run, question.scenario, lambda messages, tools: "Thanks for sharing.")
        episode = M.run_entry(run, question, M.memory_reader(backend, None), max_steps=2)
        assert question.answers[0].lower() not in M.retrieved_text(episode).lower()


def test_chain_order_and_tool_safety(tmp_path):
    run = M.MemoryRun("kv", tmp_path)
    question = run.data.question(qid("kv", QUESTIONS[0]))
    with pytest.raises(RuntimeError, match="prerequisite"):
        run.open(question)
    chain = run.data.prereqs_of(question.scenario)
    with pytest.raises(RuntimeError, match="prerequisite"):
        run.open(chain[1])
    session = run.open(chain[0])
    # only the backend's tools are dispatched; no name reaches an evaluator
    assert "not a memory tool" in session.execute(ToolCall("__import__", {"name": "os"}))
    assert "not a memory tool" in session.execute(ToolCall("_flush_memory_to_local_file", {}))
    assert (
        session.execute(ToolCall("core_memory_add", {"key": "first_name", "value": "Michael"}))
        == '{"status": "Key-value pair added."}'
    )
    assert "error" in session.execute(ToolCall("core_memory_add", {"key": "Bad Key", "value": "x"}))
    assert session.execute(ToolCall("core_memory_add", {"wrong": 1})).startswith("Error during execution: ")
    session.finish()
    # core memory is shown in the next conversation's system prompt (bfcl-eval's prompt)
    nxt = run.open(chain[1])
    assert nxt.turns[0][0]["role"] == "system" and '"first_name": "Michael"' in nxt.turns[0][0]["content"]


def test_an_agent_out_of_context_ends_the_entry_with_a_named_outcome(tmp_path):
    from env_pool.ood.openai_server import PromptTooLong

    def full(messages, tools):
        raise PromptTooLong("the prompt is 9000 tokens, the model holds 8192")

    run = M.MemoryRun("rec_sum", tmp_path)
    first = run.data.prereqs_of("healthcare")[0]
    episode = M.run_entry(run, first, full)
    assert episode.outcome == "context_overflow" and episode.tool_calls == 0
    assert first.id in run.done  # the chain goes on (bfcl-eval flushes whatever happened)


@pytest.mark.slow
def test_our_generator_plays_a_scenario_and_is_scored(tmp_path):
    """The real path with our vLLM generator (the tiny random model) as the
    agent: the healthcare chain and one question. Untrained, so only the
    plumbing is checked: named outcomes, a verdict, no crash."""
    from actors.generation.vllm_engine import VllmGenerator
    from evaluation.ood_backend import GeneratorChat, tool_agent
    from rollout.generator import SamplingConfig
    from weights.model_assets import prepare_tiny_model

    generator = VllmGenerator(str(prepare_tiny_model()), max_model_len=8192, cpu_kv_cache_gb=1)
    try:
        agent = tool_agent(GeneratorChat(generator, SamplingConfig(temperature=0.0, max_new_tokens=16)))
        for backend in M.BACKENDS:
            run = M.MemoryRun(backend, tmp_path / backend)
            episodes = M.play_prereqs(run, "healthcare", agent)
            question = run.data.question(qid(backend, QUESTIONS[1]))
            episode = M.run_entry(run, question, agent)
            score = M.score_episode(run, episode)
            assert all(e.outcome in ("completed", "step_limit", "context_overflow") for e in episodes + [episode])
            assert sum(len(s) for e in episodes for s in e.steps) >= len(run.data.prereqs_of("healthcare"))
            assert score.backend == backend and score.valid in (True, False)
    finally:
        generator.close()


def test_whole_backend_gold_and_wrong_answers():
    """Every question of each backend through run_backend: answering each
    with its gold answer scores 155 of 155, a wrong answer 0."""
    for backend in M.BACKENDS:
        data = M.load(backend)
        answers = {q.id: q.answers[0] for q in data.questions}
        writer = M.note_taker(backend)

        def gold(entry_id):
            return M.memory_reader(backend, answers[entry_id]) if entry_id in answers else writer

        result = M.run_backend(backend, gold)
        assert len(result.scores) == 155 and result.accuracy == 1.0 and result.label == M.LABEL
        assert len(result.prereq_episodes) == 37
        wrong = M.run_backend(
            backend,
            lambda e: M.memory_reader(backend, "I do not know") if e in answers else writer,
            question_ids=[q.id for q in data.questions[:10]],
        )
        assert len(wrong.scores) == 10 and wrong.accuracy == 0.0
