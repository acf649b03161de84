"""The OOD harness views of `seal evaluate` without a model: registration,
task ids and categories, selection and limits, the summary notes, and how
a harness run becomes a TaskResult (scripted replies stand in for the model)."""

from __future__ import annotations

import pytest

from env_pool.ood import AVAILABLE_VIEWS, UNAVAILABLE_VIEWS
from evaluation import ood_views as O
from evaluation.catalog import VIEW_BUILDERS, build_views, register_view, stratified_head, task_category
from evaluation.config import EvalConfig
from evaluation.records import OOD_TEST
from evaluation.view_base import ViewContext


def ctx(**cfg) -> ViewContext:
    return ViewContext(EvalConfig(**cfg), lambda split: [], lambda: [], 0)


@pytest.fixture
def fake_ids(monkeypatch):
    """Harness task lists without importing tau2 or bfcl-eval."""

    def ids(view):
        harness, target = O.VIEW_TARGETS[view]
        if harness == "tau2":
            return [O.tau2_task_id(target, str(i)) for i in range(5)]
        return [f"memory_{target}_{i}-customer-{i}" for i in range(5)]

    monkeypatch.setattr(O, "view_task_ids", ids)


def test_every_harness_view_is_registered_with_the_ood_role():
    assert set(AVAILABLE_VIEWS) | set(UNAVAILABLE_VIEWS) == set(O.OOD_VIEWS)
    assert all(VIEW_BUILDERS[name] is builder for name, builder in O.OOD_VIEWS.items())  # the catalog holds them
    for name, reason in UNAVAILABLE_VIEWS.items():
        view = VIEW_BUILDERS[name](ctx())
        assert view.role == OOD_TEST and view.unavailable == reason and "network" in reason and not view.task_ids
    with pytest.raises(ValueError, match="registered twice"):
        register_view("tau2_retail")(lambda c: None)


def test_task_ids_carry_their_domain_or_backend():
    assert O.split_tau2_id("tau2_retail/12") == ("retail", "12")
    assert O.split_tau2_id(O.tau2_task_id("telecom", "[mobile_data]x/y")) == ("telecom", "[mobile_data]x/y")
    assert task_category("tau2_airline/3") == "airline"
    assert task_category("memory_kv_0-customer-0") == "kv"
    assert task_category("memory_rec_sum_40-healthcare-2") == "rec_sum"
    for bad in ("tau2_retail", "tau2_retail/", "retail/3"):
        with pytest.raises(ValueError):
            O.split_tau2_id(bad)
    with pytest.raises(ValueError):
        O.memory_backend("memory_vector_0-customer-0")
    for bad in ("tau2_retail_0", "memory_vector_0-customer-0"):  # a known prefix, not a known id
        with pytest.raises(KeyError, match="category rule"):
            task_category(bad)


def test_selection_respects_limit_and_per_view_limit(fake_ids):
    views = build_views(
        ["tau2_retail", "bfcl_memory_kv", "bfcl_memory_vector"], ctx(limit=2, view_limits={"bfcl_memory_kv": 1})
    )
    retail, kv, vector = views
    assert retail.task_ids == ("tau2_retail/0", "tau2_retail/1") and kv.task_ids == ("memory_kv_0-customer-0",)
    assert retail.role == kv.role == OOD_TEST and vector.unavailable
    assert (
        O.is_harness(retail.env)
        and O.is_harness(kv.env)
        and not O.is_harness(None)
        and not O.is_harness({"_target_": "x"})
    )
    assert retail.env["domain"] == "retail" and retail.env[O.HARNESS_KEY] == "tau2"
    assert kv.env["backend"] == "kv" and kv.env[O.HARNESS_KEY] == "bfcl_memory"
    # the env dicts differ per view, so their cache keys differ
    assert O.harness_env("tau2_retail") != O.harness_env("tau2_airline")
    unlimited = build_views(["tau2_airline"], ctx())
    assert len(unlimited[0].task_ids) == 5
    with pytest.raises(ValueError, match="unknown views"):
        build_views(["tau2_mock"], ctx())


def test_stratified_limit_over_mixed_harness_ids():
    ids = ["memory_kv_0-a-0", "memory_kv_1-a-1", "memory_rec_sum_0-a-0", "tau2_retail/0"]
    assert stratified_head(ids, 3) == ["memory_kv_0-a-0", "memory_rec_sum_0-a-0", "tau2_retail/0"]


def test_a_missing_harness_package_makes_the_view_unavailable(monkeypatch):
    def missing(view):
        raise ImportError("No module named 'tau2'")

    monkeypatch.setattr(O, "view_task_ids", missing)
    (view,) = build_views(["tau2_retail"], ctx())
    assert view.unavailable and "not installed" in view.unavailable and not view.task_ids


def test_unavailable_listing_and_notes(fake_ids):
    assert O.unavailable_views(["id", "replay"]) == {}
    assert O.unavailable_views(["id", "bfcl_memory_kv"]) == UNAVAILABLE_VIEWS
    views = build_views(
        ["id", "tau2_retail", "bfcl_memory_rec_sum"], ViewContext(EvalConfig(), lambda s: ["toy_0"], lambda: [], 0)
    )
    notes = O.harness_notes(views, {"A_0": "tiny", "A_1": "snapshots/A_1/weights"})
    assert set(notes) == {"tau2_retail", "bfcl_memory_rec_sum"}
    assert notes["tau2_retail"]["user_simulator_weights"] == {"A_0": "tiny", "A_1": "snapshots/A_1/weights"}
    assert "gpt-4.1" in notes["tau2_retail"]["comparability"]
    assert notes["bfcl_memory_rec_sum"]["label"] == "BFCL V4 Memory (kv + rec_sum)"
    lines = O.note_lines(notes)
    assert any(
        "user simulator" in line and "not comparable" in line and "A_1: snapshots/A_1/weights" in line for line in lines
    )
    assert any(line.startswith("bfcl_memory_rec_sum: BFCL V4 Memory (kv + rec_sum)") for line in lines)


# ------------------------------------------------ harness runs as TaskResults
def _post(base_url: str, model: str) -> None:
    import json
    import urllib.request

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"{base_url}/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _scripted_runner(tmp_path, prompt_tokens=100, completion_tokens=7):
    from env_pool.ood.openai_server import Reply
    from evaluation.ood_runner import OodRunner, TokenCounter

    runner = OodRunner(None, None, snapshot="A_1", seed=0, details=tmp_path / "ood.jsonl")
    reply = lambda *a: Reply("Hello.", prompt_tokens, completion_tokens)
    runner._agent, runner._user = TokenCounter(reply), TokenCounter(reply)
    return runner


@pytest.mark.parametrize(
    "termination,outcome,error",
    [
        ("max_steps", "step_limit", None),
        ("user_stop", "completed", None),
        ("agent_error", "aborted", None),
        ("process_error", "aborted", "RuntimeError: engine gone"),
    ],
)
def test_a_tau2_episode_becomes_a_task_result(tmp_path, monkeypatch, termination, outcome, error):
    import json

    from env_pool.ood import tau2
    from evaluation.ood_runner import AGENT_NAME, USER_NAME

    seen = {}

    def episode(domain, task_id, agent_llm, user_llm, base_url, **kw):
        seen.update(domain=domain, task_id=task_id, agent=agent_llm, user=user_llm, **kw)
        for model in (AGENT_NAME, AGENT_NAME, USER_NAME):  # two agent replies, one user reply
            _post(base_url, model)
        return tau2.Tau2EpisodeResult(
            "tau2_retail",
            domain,
            task_id,
            1.0 if error is None else 0.0,
            error is None,
            termination,
            3,
            0,
            2,
            2,
            agent_llm,
            user_llm,
            1.5,
            process_error=error,
        )

    monkeypatch.setattr(tau2, "run_episode", episode)
    runner = _scripted_runner(tmp_path)
    try:
        r = runner.run(O.harness_env("tau2_retail"), "tau2_retail", "tau2_retail/7")
    finally:
        runner.close()
    assert seen["domain"] == "retail" and seen["task_id"] == "7" and seen["agent"] != seen["user"]
    assert seen["max_steps"] == O.TAU2_MAX_STEPS and seen["temperature"] == 0.0
    assert (r.snapshot, r.view, r.task_id, r.category) == ("A_1", "tau2_retail", "tau2_retail/7", "retail")
    assert r.outcome == outcome and r.process_error == error and r.success == (error is None)
    assert r.tool_calls == 3 and r.wall_s == 1.5
    assert r.generated_tokens == 14 and r.prompt_tokens == 100 + 7 - 14  # the agent's side only
    (detail,) = [json.loads(line) for line in (tmp_path / "ood.jsonl").read_text().splitlines()]
    assert detail["termination"] == termination and detail["user_requests"] == 1 and detail["agent_requests"] == 2
    assert detail["simulator_model"] == USER_NAME


def test_a_harness_crash_is_a_process_error(tmp_path, monkeypatch):
    from env_pool.ood import tau2

    def boom(*a, **kw):
        raise RuntimeError("tau2 broke")

    monkeypatch.setattr(tau2, "run_episode", boom)
    runner = _scripted_runner(tmp_path)
    try:
        r = runner.run(O.harness_env("tau2_retail"), "tau2_retail", "tau2_retail/7")
        wrong = runner.run(O.harness_env("tau2_airline"), "tau2_airline", "tau2_retail/7")
    finally:
        runner.close()
    assert r.process_error == "crash: RuntimeError: tau2 broke" and r.outcome == "aborted" and not r.success
    assert r.category == "retail" and "not in the airline domain" in wrong.process_error


@pytest.mark.parametrize("answer_right", [True, False])
def test_a_memory_question_plays_its_chain_once_and_is_scored(tmp_path, answer_right):
    import json

    from env_pool.ood import bfcl_memory as M
    from env_pool.ood.openai_server import Reply
    from evaluation.ood_runner import OodRunner, TokenCounter

    questions = [q for q in M.load("kv").questions if q.scenario == "customer"][:2]
    answer = questions[0].answers[0] if answer_right else "I do not know"
    runner = OodRunner(None, None, snapshot="A_0", seed=0, details=tmp_path / "ood.jsonl")
    # every step is prose: prerequisite turns end at once, the question's reply is the answer
    runner._agent = runner._user = TokenCounter(lambda *a: Reply("{'answer': %r}" % answer, 50, 5))
    env = O.harness_env("bfcl_memory_kv")
    try:
        first = runner.run(env, "bfcl_memory_kv", questions[0].id)
        second = runner.run(env, "bfcl_memory_kv", questions[1].id)
    finally:
        runner.close()
    assert first.success is answer_right and first.reward == float(answer_right) and first.process_error is None
    assert (first.category, first.outcome, first.tool_calls) == ("kv", "completed", 0)
    assert first.generated_tokens == 5 * len(questions[0].turns)  # the question's own replies only
    details = [json.loads(line) for line in (tmp_path / "ood.jsonl").read_text().splitlines()]
    chain = len(M.load("kv").prereqs_of("customer"))
    assert details[0]["prereq_entries"] == chain and "prereq_entries" not in details[1]  # played once per scenario
    assert details[0]["valid"] is answer_right and second.view == "bfcl_memory_kv"
