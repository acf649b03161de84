"""`seal plan [overrides]`: the plan (seal/estimate/plan.py) as a table or one JSON object."""

from __future__ import annotations

import json

from seal.commands.plan_report import plan_json, plan_table
from seal.config import Settings, compose
from seal.errors import CliError
from seal.estimate.plan import build_plan


def run(args) -> int:
    """The `seal plan` handler: the table (or --json), then exit 2 with one line when it does not fit."""
    cfg = compose(args.overrides)
    plan = build_plan(cfg, settings=Settings.of(cfg))
    print(json.dumps(plan_json(plan)) if args.json else plan_table(plan), flush=True)
    if not plan.fits:
        raise CliError(plan.verdict())
    return 0
