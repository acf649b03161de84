"""SEAGym-style evaluation of a run's snapshots (docs/design.md, evaluation).

records: typed per-task results and snapshot records (CSV/JSON);
metrics: pure metric functions and ``summarize``;
report: markdown report with plots (imports matplotlib lazily).
"""
