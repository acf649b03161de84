"""Environments the policy acts in: BFCL V3 multi-turn, the shopping-list env and a small toy env,
all on one step loop (env_pool/multi_turn.py); env_pool/registry.py maps a task id to its env's
category.

Heavy parts (bfcl-eval) load lazily, on first use.
"""
