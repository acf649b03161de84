"""One training run: the driver loop, its step metrics, run log, run directory, snapshots,
progress lines, closing evaluation and summary. Imports seal/runtime, never seal/commands."""
