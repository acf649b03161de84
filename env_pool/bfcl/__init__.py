"""BFCL V3 multi-turn: tasks, safe execution, verifier and diagnosis, episodes."""
