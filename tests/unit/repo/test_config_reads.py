"""Every read of the composed config goes through seal/config.py's typed groups (Settings and its
helpers), which say what each key must be and fail on a missing one: a read with a default of its
own elsewhere (``cfg.get("key", 600.0)``, a ``_select(cfg, key, default)`` helper, the learner's
raw ``cfg.learner.cfg.x``) could silently split `seal plan` from the run. A line that reads the
config by one of those routes outside seal/config.py fails here with its file and line."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# The packages that run the loop; tests and benchmarks compose configs of their own.
CHECKED = ("seal", "actors", "learner", "replay", "rollout", "evaluation", "weights", "families")
ALLOWED = {"seal/config.py"}  # the one module that reads the config

# A config object is named cfg, config, spec, or ends in _cfg or _spec; a HF model's config.json
# read as a dict is named config_json, a JSON record by what it records.
READS = {
    "a _select helper with its own default": re.compile(r"\b_select\("),
    "the learner's raw config node": re.compile(r"\bcfg\.learner\.cfg\."),
    "a .get on a config object": re.compile(r"\b(?:cfg|config|spec|\w+_cfg|\w+_spec)\.get\("),
}


def _python_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in listed.stdout.split() if p.split("/")[0] in CHECKED and p not in ALLOWED]


def config_reads(text: str) -> list[tuple[int, str]]:
    """(line, what) for each read of the config outside the typed groups in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        found += [(number, what) for what, pattern in READS.items() if pattern.search(code)]
    return found


def test_the_patterns_catch_each_route_and_spare_records():
    assert [w for _, w in config_reads('timeout = _select(cfg, "learner.timeout_s", 600.0)')] == [
        "a _select helper with its own default"
    ]
    assert config_reads("zero = self.cfg.learner.cfg.zero_stage")
    assert config_reads('lora = (spec.get("cfg") or {}).get("lora")')
    assert config_reads('target = gen_spec.get("_target_")')
    assert config_reads('paths = cfg.get("python_path") or []')
    assert config_reads('rank = learner_cfg.get("rank")')
    assert not config_reads('arch = config_json.get("model_type")')  # a HF config.json, not ours
    assert not config_reads('steps = row.get("step")')  # a metrics record
    assert not config_reads("# cfg.get(key) is what this replaced")


def test_the_config_is_read_only_through_seal_config():
    bad = [
        f"{path}:{line}: {what}" for path in _python_files() for line, what in config_reads((ROOT / path).read_text())
    ]
    assert not bad, "config read outside seal/config.py (use its typed Settings):\n" + "\n".join(bad)
