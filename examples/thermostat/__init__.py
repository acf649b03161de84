"""A complete environment of one's own: a home's thermostats (docs/custom-environment.md walks through it)."""
