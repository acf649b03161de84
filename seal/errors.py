"""Errors the `seal` command reports as one line (exit status 2)."""


class CliError(Exception):
    """A user-facing error: bad input, bad option, missing file."""
