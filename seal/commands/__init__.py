"""The `seal` command line: one module per command; they wire seal/run and seal/runtime."""
